//! The one-shot LL tile all-reduce (`collectives::tile_ll`) that `symm_tile_all_reduce` runs for
//! small tiles, beside the two-shot it runs for the others: at every world size of one node,
//! many tile indices (matched by index: every rank runs each tile on a different CTA), back to
//! back in one launch and over launches, against the f64 reference, bitwise equal on every rank
//! and bitwise equal to the two-shot of the same inputs (a node whose signal region lacks the LL
//! area runs every tile two-shot); calls that exchange nothing between LL calls of a tile;
//! epochs wrapping around; and faults: a lost LL packet gives TIMEOUT (recorded) and never a
//! wrong answer on a rank that returns OK, delayed or overtaking packets change nothing.
//!
//! A fault plan applies to every simulated thread of the process, so every test of this binary
//! holds `sim_faults::serial()`: they run one at a time.

mod sim;
use ironlink_device::abi::{signal, MAX_LL_TILES};
use ironlink_device::collectives::choice::{tile_all_reduce, TileAlgorithm, TILE_LL_MAX_BYTES};
use ironlink_device::hw::cta_rank;
use ironlink_device::hw::sim_faults::{self, Fault, Kind};
use ironlink_device::transport::tile_inbox;
use sim::*;

const HEAP: usize = 1 << 20;
const THREADS: u32 = 32;

/// One tile of a test: its index and shape in elements, at heap byte `offset`.
#[derive(Clone, Copy, Debug)]
struct TileCase {
    index: usize,
    offset: usize,
    rows: usize,
    cols: usize,
    stride: usize,
}

impl TileCase {
    fn at(&self, dt: Dt, i: usize) -> usize {
        self.offset + i * self.stride * dt.size()
    }

    /// Bytes from the first element to one past the last.
    fn span(&self, dt: Dt) -> usize {
        ((self.rows - 1) * self.stride + self.cols) * dt.size()
    }

    /// The algorithm `symm_tile_all_reduce` runs for this tile on `node`.
    fn algorithm(&self, node: &Node, dt: Dt) -> TileAlgorithm {
        let row_bytes = self.cols * dt.size();
        let packets = self.rows * row_bytes.div_ceil(8);
        tile_all_reduce(node.context(0), self.index, self.rows * row_bytes, packets)
    }

    fn fill(&self, node: &mut Node, rank: usize, dt: Dt, rng: &mut Rng, op: i32) -> Vec<f64> {
        let (lo, hi) = if op == reduce_op::PROD {
            (0.5, 1.5)
        } else {
            (-4.0, 4.0)
        };
        let mut all = Vec::new();
        for i in 0..self.rows {
            let vals: Vec<f32> = (0..self.cols).map(|_| rng.uniform(lo, hi)).collect();
            all.extend(fill(node, rank, self.at(dt, i), dt, &vals));
        }
        all
    }

    /// The tile's bytes on `rank` (rows only, not the gaps).
    fn bytes(&self, node: &Node, rank: usize, dt: Dt) -> Vec<u8> {
        let heap = node.heap(rank);
        (0..self.rows)
            .flat_map(|i| heap[self.at(dt, i)..][..self.cols * dt.size()].to_vec())
            .collect()
    }

    fn read(&self, node: &Node, rank: usize, dt: Dt) -> Vec<f64> {
        (0..self.rows)
            .flat_map(|i| read(node, rank, self.at(dt, i), dt, self.cols))
            .collect()
    }

    /// The row gaps and 32 bytes on either side still hold guard bytes on every rank.
    fn assert_gaps(&self, node: &Node, dt: Dt, what: &str) {
        assert_guard(node, what, self.offset - 32, self.offset);
        for i in 0..self.rows {
            let end = self.at(dt, i) + self.cols * dt.size();
            let next = if i + 1 < self.rows {
                self.at(dt, i + 1)
            } else {
                end + 32
            };
            assert_guard(node, what, end, next);
        }
    }
}

/// Lays out tiles of (index, rows, cols, stride) one after another from heap byte 4096, 64
/// bytes apart.
fn layout(dt: Dt, shapes: &[(usize, usize, usize, usize)]) -> Vec<TileCase> {
    let mut offset = 4096;
    shapes
        .iter()
        .map(|&(index, rows, cols, stride)| {
            let t = TileCase {
                index,
                offset,
                rows,
                cols,
                stride,
            };
            offset = (offset + t.span(dt) + 64).next_multiple_of(64);
            assert!(offset + 64 <= HEAP);
            t
        })
        .collect()
}

/// Tiles around the LL limits of `world`: small ones, the largest whose packets fill a box, one
/// element more (two-shot), odd shapes, the last tile index with boxes and the first without.
fn shapes(world: usize, dt: Dt) -> Vec<(usize, usize, usize, usize)> {
    let full = (tile_inbox::capacity(world) * 8).min(TILE_LL_MAX_BYTES) / dt.size();
    vec![
        (0, 3, 37, 40),
        (1, 1, full, full),
        (2, 1, full + 1, full + 1),
        (7, 5, 3, 5),
        (9, 4, 64, 64),
        (MAX_LL_TILES - 1, 2, 64, 70),
        (MAX_LL_TILES, 2, 64, 64),
        (300, 1, 1, 1),
    ]
}

/// Runs `rounds` all-reduces of every tile per launch: rank r runs tile case k on CTA
/// (k + r) % ctas, each CTA its tiles in increasing index order.
fn run(node: &Node, tiles: &[TileCase], dt: Dt, op: i32, ctas: u32, rounds: usize) -> Vec<i32> {
    node.run_worst("tile ll", ctas, THREADS, |rank, ctx| {
        let cta = cta_rank() as usize;
        for _ in 0..rounds {
            for (k, t) in tiles.iter().enumerate() {
                if (k + rank) % ctas as usize != cta {
                    continue;
                }
                let s = api::symm_tile_all_reduce(
                    ctx,
                    node.addr(rank, t.offset),
                    t.rows as i64,
                    t.cols as i64,
                    t.stride as i64,
                    t.index as i64,
                    op,
                    dt.code(),
                );
                if s != status::OK {
                    return s;
                }
            }
        }
        status::OK
    })
}

/// Two nodes with the same inputs in every tile: `ll` with the LL area, `two_shot` without.
struct Pair {
    ll: Node,
    two_shot: Node,
    /// The f64 reference of one all-reduce of each tile.
    want: Vec<Vec<f64>>,
}

fn pair(world: usize, tiles: &[TileCase], dt: Dt, op: i32, seed: u64) -> Pair {
    let mut ll = Node::new(world, HEAP, 1 << 16);
    let mut two_shot = Node::new(world, HEAP, 1 << 16);
    for r in 0..world {
        two_shot.ctx_mut(r).signal_size = signal::MIN_BYTES as u64;
    }
    let mut want = Vec::new();
    for t in tiles {
        let mut inputs = Vec::new();
        for r in 0..world {
            let mut rng = Rng::new(seed * 1000 + t.index as u64 * 10 + r as u64);
            inputs.push(t.fill(&mut ll, r, dt, &mut rng, op));
            let mut rng = Rng::new(seed * 1000 + t.index as u64 * 10 + r as u64);
            t.fill(&mut two_shot, r, dt, &mut rng, op);
        }
        want.push(reference(op, &inputs));
    }
    Pair { ll, two_shot, want }
}

/// Every rank of `p.ll` holds the same bytes as rank 0 of `p.two_shot` in every tile.
fn assert_bitwise(p: &Pair, tiles: &[TileCase], dt: Dt, what: &str) {
    for t in tiles {
        let want = t.bytes(&p.two_shot, 0, dt);
        for r in 0..p.ll.world {
            assert!(
                t.bytes(&p.ll, r, dt) == want,
                "{what}: tile {} on rank {r} differs from the two-shot result",
                t.index
            );
            assert!(
                t.bytes(&p.two_shot, r, dt) == want,
                "{what}: two-shot tile {} on rank {r} differs from rank 0",
                t.index
            );
        }
        t.assert_gaps(&p.ll, dt, what);
    }
}

#[test]
fn ll_tiles_at_every_world_match_the_two_shot_bitwise() {
    let _g = sim_faults::serial();
    for world in 2..=8 {
        let dt = Dt::ALL[world % 3];
        let op = OPS[world % OPS.len()];
        let what = format!("world={world} {dt:?} op={op}");
        let tiles = layout(dt, &shapes(world, dt));
        let p = pair(world, &tiles, dt, op, world as u64);
        let algorithms: Vec<_> = tiles.iter().map(|t| t.algorithm(&p.ll, dt)).collect();
        let ll = TileAlgorithm::OneShotLl;
        let two = TileAlgorithm::TwoShot;
        assert_eq!(
            algorithms,
            [ll, ll, two, ll, ll, ll, two, two],
            "{what}: the tiles do not take the algorithms the test means to mix"
        );
        for t in &tiles {
            assert_eq!(t.algorithm(&p.two_shot, dt), two, "{what}: no LL area");
        }
        let ctas = if world <= 4 { 3 } else { 2 };
        // One call per tile: against the reference.
        for nd in [&p.ll, &p.two_shot] {
            assert_eq!(
                run(nd, &tiles, dt, op, ctas, 1),
                vec![status::OK; world],
                "{what}"
            );
        }
        assert_bitwise(&p, &tiles, dt, &what);
        for (t, want) in tiles.iter().zip(&p.want) {
            for r in 0..world {
                assert_close(
                    &format!("{what} tile {}", t.index),
                    dt,
                    &t.read(&p.ll, r, dt),
                    want,
                );
            }
        }
        // Three calls per tile back to back, then a second launch of three.
        for launch in 0..2 {
            for nd in [&p.ll, &p.two_shot] {
                let st = run(nd, &tiles, dt, op, ctas, 3);
                assert_eq!(st, vec![status::OK; world], "{what} launch {launch}");
            }
            assert_bitwise(
                &p,
                &tiles,
                dt,
                &format!("{what}, back to back, launch {launch}"),
            );
        }
        // The two-shot node never wrote its (allocated but unannounced) LL area.
        for r in 0..world {
            let area = &p.two_shot.signal(r)[signal::TILE_LL_OFFSET..];
            assert!(area.iter().all(|b| *b == 0), "{what}: rank {r}");
        }
    }
}

/// LL calls of one tile with calls between them that meet no peer (an empty tile) or meet them
/// two-shot, every rank late in turn: the halves of the tile's boxes must alternate by LL call,
/// not by epoch (see `transport::tile_inbox`), or a rank overwrites packets its peer still reads
/// (a TIMEOUT, or a wrong sum).
#[test]
fn ll_calls_with_empty_and_two_shot_calls_between_them() {
    let _g = sim_faults::serial();
    const CALLS: usize = 40;
    for world in [2, 3] {
        let dt = Dt::Bf16;
        let mut shapes = Vec::new();
        for _ in 0..CALLS {
            shapes.push((5, 2, 300, 300));
        }
        shapes.push((5, 1, 10_000, 10_000)); // above TILE_LL_MAX_BYTES: two-shot
        let tiles = layout(dt, &shapes);
        let p = pair(world, &tiles, dt, reduce_op::SUM, 40 + world as u64);
        let big = tiles[CALLS];
        assert_eq!(big.algorithm(&p.ll, dt), TileAlgorithm::TwoShot);
        assert_eq!(tiles[0].algorithm(&p.ll, dt), TileAlgorithm::OneShotLl);
        let st = p.ll.run_worst("halves", 1, THREADS, |rank, ctx| {
            let call = |t: &TileCase, rows: usize| {
                api::symm_tile_all_reduce(
                    ctx,
                    p.ll.addr(rank, t.offset),
                    rows as i64,
                    t.cols as i64,
                    t.stride as i64,
                    t.index as i64,
                    reduce_op::SUM,
                    dt.code(),
                )
            };
            for (i, t) in tiles[..CALLS].iter().enumerate() {
                if i % world == rank {
                    std::thread::sleep(std::time::Duration::from_micros(300));
                }
                let mut s = call(t, t.rows);
                if s == status::OK {
                    s = call(t, 0);
                }
                if s == status::OK && i % 8 == 7 {
                    s = call(&big, big.rows); // the same tile index, two-shot
                }
                if s != status::OK {
                    return s;
                }
            }
            status::OK
        });
        assert_eq!(st, vec![status::OK; world], "world={world}");
        for (i, (t, want)) in tiles[..CALLS].iter().zip(&p.want).enumerate() {
            let got = t.read(&p.ll, 0, dt);
            assert_close(&format!("world={world} call {i}"), dt, &got, want);
            for r in 1..world {
                assert!(
                    t.bytes(&p.ll, r, dt) == t.bytes(&p.ll, 0, dt),
                    "world={world} call {i}: rank {r} differs from rank 0"
                );
            }
        }
    }
}

/// Tile epochs wrapping around (30 bits, skipping 0) in the middle of LL and two-shot calls.
#[test]
fn ll_tiles_across_the_epoch_wrap_around() {
    let _g = sim_faults::serial();
    let (world, dt, op) = (3, Dt::F32, reduce_op::AVG);
    let tiles = layout(dt, &shapes(world, dt));
    let mut p = pair(world, &tiles, dt, op, 77);
    p.ll.set_tile_epochs((1 << 30) - 3);
    p.two_shot.set_tile_epochs((1 << 30) - 3);
    for nd in [&p.ll, &p.two_shot] {
        assert_eq!(run(nd, &tiles, dt, op, 2, 6), vec![status::OK; world]);
    }
    assert_bitwise(&p, &tiles, dt, "wrap-around");
}

/// Tiles of the fault tests: those of `shapes` that go over LL at world 3, in bf16.
const FAULT_WORLD: usize = 3;

fn fault_tiles(node: &Node) -> Vec<TileCase> {
    layout(Dt::Bf16, &shapes(FAULT_WORLD, Dt::Bf16))
        .into_iter()
        .filter(|t| t.algorithm(node, Dt::Bf16) == TileAlgorithm::OneShotLl)
        .collect()
}

/// Installs `fault`, runs one all-reduce of every LL tile on a fresh node (waits shortened when
/// a packet is dropped), and checks: every rank that returned OK holds the fault-free result;
/// with `must_fail`, some rank returned TIMEOUT, and every rank that failed recorded it; without,
/// every rank returned OK. Returns the packets sent and how many were overtaken.
fn run_fault(fault: Fault, must_fail: bool) -> (u64, u64) {
    let (world, dt, op) = (FAULT_WORLD, Dt::Bf16, reduce_op::SUM);
    let all = layout(dt, &shapes(world, dt));
    let mut p = pair(world, &all, dt, op, 3);
    let tiles = fault_tiles(&p.ll);
    assert_eq!(
        run(&p.two_shot, &tiles, dt, op, 2, 1),
        vec![status::OK; world]
    );
    for r in 0..world {
        p.ll.ctx_mut(r).timeout_ns = if must_fail {
            100_000_000
        } else {
            20_000_000_000
        };
    }
    sim_faults::set(Some(fault));
    let st = run(&p.ll, &tiles, dt, op, 2, 1);
    let seen = (sim_faults::count(Kind::Packet), sim_faults::overtaken());
    sim_faults::set(None);
    let what = format!("{fault:?} ({} packets)", seen.0);
    if must_fail {
        assert!(st.contains(&status::TIMEOUT), "{what}: {st:?}");
    } else {
        assert_eq!(st, vec![status::OK; world], "{what}");
    }
    for (r, s) in st.iter().enumerate() {
        if *s != status::OK {
            assert_eq!(*s, status::TIMEOUT, "{what}: rank {r}");
            assert_eq!(p.ll.recorded_error(r), status::TIMEOUT, "{what}: rank {r}");
            continue;
        }
        for t in &tiles {
            assert!(
                t.bytes(&p.ll, r, dt) == t.bytes(&p.two_shot, 0, dt),
                "{what}: rank {r} returned OK with a wrong tile {}",
                t.index
            );
        }
    }
    seen
}

/// Packets one all-reduce of every fault tile sends, over all ranks.
fn fault_packets() -> u64 {
    let node = Node::new(FAULT_WORLD, HEAP, 0);
    let per_rank: usize = fault_tiles(&node)
        .iter()
        .map(|t| t.rows * (t.cols * 2).div_ceil(8) * (FAULT_WORLD - 1))
        .sum();
    (per_rank * FAULT_WORLD) as u64
}

#[test]
fn a_lost_ll_tile_packet_times_out_and_never_gives_a_wrong_answer() {
    let _g = sim_faults::serial();
    let sent = fault_packets();
    // The first packet, one in the middle and the last (in the order the threads ran).
    for nth in [0, sent / 2, sent - 1] {
        let fault = Fault::Drop {
            kind: Kind::Packet,
            nth,
        };
        run_fault(fault, true);
    }
}

#[test]
fn delayed_or_overtaking_ll_tile_packets_change_nothing() {
    let _g = sim_faults::serial();
    let (_, overtaken) = run_fault(Fault::ReorderPackets, false);
    assert!(overtaken > 0, "no packet was overtaken");
    let delay = Fault::Delay {
        kind: Kind::Packet,
        max_us: 20,
    };
    let (sent, _) = run_fault(delay, false);
    assert_eq!(sent, fault_packets(), "the drop test's packet count");
}
