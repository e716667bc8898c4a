//! The collectives on the CPU simulator: every dtype and op, world sizes 2, 3, 4 and 8, several
//! grids and CTA sizes, odd element counts and unaligned starts, both all-reduce algorithms;
//! results against an f64 reference, bitwise equal across ranks, nothing written outside.

mod sim;
use sim::*;

/// Hands out heap regions with guard gaps, remembering them for the guard check.
struct Layout {
    next: usize,
    used: Vec<(usize, usize)>,
}

impl Layout {
    fn new() -> Self {
        Layout {
            next: 256,
            used: Vec::new(),
        }
    }
    /// A region of `bytes` starting `skew` bytes past a 256-byte boundary.
    fn take(&mut self, bytes: usize, skew: usize) -> usize {
        let off = self.next + skew;
        self.used.push((off, off + bytes));
        self.next = (off + bytes + 64).div_ceil(256) * 256;
        off
    }
    /// Every byte outside the regions is still a guard byte on every rank.
    fn check_guards(&self, node: &Node, what: &str) {
        let mut lo = 0;
        let mut used = self.used.clone();
        used.sort();
        for (a, b) in used {
            assert_guard(node, what, lo, a);
            lo = b;
        }
        assert_guard(node, what, lo, node.heap_bytes);
    }
}

fn random_inputs(rng: &mut Rng, op: i32, n: usize) -> Vec<f32> {
    // Products of 8 values stay tame near 1; the others get signed values of a few units.
    (0..n)
        .map(|_| {
            if op == reduce_op::PROD {
                rng.uniform(0.5, 1.5)
            } else {
                rng.uniform(-4.0, 4.0)
            }
        })
        .collect()
}

/// Random inputs for `op` (`random_inputs`) of `n` elements at `offset` of every rank's heap,
/// rank by rank; each rank's values as written.
fn fill_every_rank(
    node: &mut Node,
    rng: &mut Rng,
    offset: usize,
    dt: Dt,
    op: i32,
    n: usize,
) -> Vec<Vec<f64>> {
    (0..node.world)
        .map(|r| fill(node, r, offset, dt, &random_inputs(rng, op, n)))
        .collect()
}

/// The reduce-scatter reference: rank `r`'s output is block `r` (`n` elements) of every rank's
/// input, reduced.
fn block_references(op: i32, inputs: &[Vec<f64>], n: usize) -> Vec<Vec<f64>> {
    (0..inputs.len())
        .map(|r| {
            let blocks: Vec<Vec<f64>> = inputs
                .iter()
                .map(|v| v[r * n..(r + 1) * n].to_vec())
                .collect();
            reference(op, &blocks)
        })
        .collect()
}

/// Launches `call(rank, ctx, case)` for every case back to back and asserts that every rank
/// returned OK.
fn run_all_ok<T: Sync>(
    node: &Node,
    label: &str,
    ctas: u32,
    threads: u32,
    cases: &[T],
    call: impl Fn(usize, i64, &T) -> i32 + Sync,
) {
    let status = node.run(label, ctas, threads, |rank, ctx| {
        first_failure(cases, |c| call(rank, ctx, c))
    });
    assert_eq!(status, vec![status::OK; node.world], "{label}");
}

/// Results are bitwise identical across ranks.
fn assert_same_bytes(node: &Node, what: &str, offset: usize, bytes: usize) {
    let first = &node.heap(0)[offset..offset + bytes];
    for r in 1..node.world {
        assert!(
            first == &node.heap(r)[offset..offset + bytes],
            "{what}: rank {r} differs from rank 0"
        );
    }
}

struct ArCase {
    dt: Dt,
    op: i32,
    n: usize,
    offset: usize,
    want: Vec<f64>,
}

impl ArCase {
    /// The all-reduce's result: the same bytes on every rank, close to the reference.
    fn check(&self, node: &Node, what: &str) {
        assert_same_bytes(node, what, self.offset, self.n * self.dt.size());
        let got = read(node, 0, self.offset, self.dt, self.n);
        assert_close(what, self.dt, &got, &self.want);
    }
}

/// Runs every dtype x op x size through all-reduce. With `force`, the context's size limits are
/// set so that every case takes that algorithm (and the test checks that it does); without, the
/// defaults apply and the small scratch makes the algorithms alternate from call to call.
fn all_reduce_matrix(
    world: usize,
    ctas: u32,
    threads: u32,
    scratch: usize,
    force: Option<Algorithm>,
) {
    let sizes = [1usize, 2, 7, 33, 100, 517, 3001];
    let mut node = Node::new(world, 6 << 20, scratch);
    if let Some(algo) = force {
        let (one_shot, ll) = match algo {
            Algorithm::OneShotLl => (u64::MAX, u64::MAX),
            Algorithm::TwoShotLl => (0, u64::MAX),
            Algorithm::TwoShot => (0, 0),
        };
        for r in 0..world {
            node.ctx_mut(r).ar_one_shot_max_bytes = one_shot;
            node.ctx_mut(r).ar_ll_max_bytes = ll;
        }
    }
    let mut layout = Layout::new();
    let mut rng = Rng::new(world as u64 * 1000 + ctas as u64);
    let mut cases = Vec::new();
    for dt in Dt::ALL {
        for op in OPS {
            for (k, n) in sizes.iter().enumerate() {
                // Every other case starts off the 16-byte grid to exercise the narrow paths.
                let offset = layout.take(n * dt.size(), if k % 2 == 1 { dt.size() } else { 0 });
                if let Some(algo) = force {
                    let got = choose(node.context(0), ctas as usize, n * dt.size());
                    assert_eq!(
                        got,
                        algo,
                        "world {world}, {ctas} CTAs, {} bytes",
                        n * dt.size()
                    );
                }
                let inputs = fill_every_rank(&mut node, &mut rng, offset, dt, op, *n);
                cases.push(ArCase {
                    dt,
                    op,
                    n: *n,
                    offset,
                    want: reference(op, &inputs),
                });
            }
        }
    }
    let label = format!("all_reduce world={world} ctas={ctas} threads={threads}");
    run_all_ok(&node, &label, ctas, threads, &cases, |rank, ctx, c| {
        api::symm_all_reduce(
            ctx,
            node.addr(rank, 0),
            c.offset as i64,
            c.n as i64,
            c.op,
            c.dt.code(),
        )
    });
    for c in &cases {
        let what = format!(
            "{label} {:?} op={} n={} offset={}",
            c.dt, c.op, c.n, c.offset
        );
        c.check(&node, &what);
    }
    layout.check_guards(&node, &label);
}

#[test]
fn all_reduce_world2() {
    all_reduce_matrix(2, 1, 32, 1 << 20, None);
    all_reduce_matrix(2, 4, 64, 1 << 20, None);
}

#[test]
fn all_reduce_world3() {
    all_reduce_matrix(3, 3, 32, 1 << 20, None);
}

#[test]
fn all_reduce_world4() {
    all_reduce_matrix(4, 2, 64, 1 << 20, None);
}

#[test]
fn all_reduce_world8() {
    all_reduce_matrix(8, 3, 32, 1 << 20, None);
}

#[test]
fn all_reduce_one_shot_ll_only() {
    all_reduce_matrix(3, 2, 32, 32 << 20, Some(Algorithm::OneShotLl));
    all_reduce_matrix(8, 3, 32, 32 << 20, Some(Algorithm::OneShotLl));
}

#[test]
fn all_reduce_two_shot_ll_only() {
    all_reduce_matrix(3, 2, 32, 32 << 20, Some(Algorithm::TwoShotLl));
    all_reduce_matrix(8, 3, 32, 32 << 20, Some(Algorithm::TwoShotLl));
}

/// With no scratch to speak of, every size takes the two-shot path whatever the limits say.
#[test]
fn all_reduce_two_shot_only() {
    all_reduce_matrix(4, 2, 32, 0, None);
    all_reduce_matrix(8, 3, 32, 1 << 20, Some(Algorithm::TwoShot));
}

/// Two-shot with its halves separated by a barrier (messages of `SEPARATE_PHASES_MIN_BYTES` and
/// more that are not 16-byte aligned), with an odd tail.
#[test]
fn all_reduce_two_shot_separate_phases() {
    let world = 3;
    let dt = Dt::F32;
    let n = SEPARATE_PHASES_MIN_BYTES / dt.size() + 5;
    let offset = 256 + 4; // off the 16-byte grid: not `Push`
    let mut node = Node::new(world, offset + n * dt.size() + 256, 1 << 20);
    let mut rng = Rng::new(4242);
    let inputs = fill_every_rank(&mut node, &mut rng, offset, dt, reduce_op::SUM, n);
    assert_eq!(
        choose(node.context(0), 2, n * dt.size()),
        Algorithm::TwoShot
    );
    let region = Region {
        offset,
        bytes: n * dt.size(),
    };
    assert_eq!(
        two_shot_variant(node.context(0), &region),
        TwoShot::Separate
    );
    let aligned = Region {
        offset: 256,
        ..region
    };
    assert_eq!(two_shot_variant(node.context(0), &aligned), TwoShot::Push);
    // Between the two switches: push where it can run, else the fused loads-and-stores.
    let mid = |offset, bytes| two_shot_variant(node.context(0), &Region { offset, bytes });
    assert_eq!(mid(256, PUSH_MIN_BYTES), TwoShot::Push);
    assert_eq!(mid(256, PUSH_MIN_BYTES - 16), TwoShot::Fused);
    assert_eq!(mid(260, SEPARATE_PHASES_MIN_BYTES - 4), TwoShot::Fused);
    let status = node.run("all_reduce 32 MiB", 2, 64, |rank, ctx| {
        api::symm_all_reduce(
            ctx,
            node.addr(rank, 0),
            offset as i64,
            n as i64,
            reduce_op::SUM,
            dt.code(),
        )
    });
    assert_eq!(status, vec![status::OK; world]);
    let case = ArCase {
        dt,
        op: reduce_op::SUM,
        n,
        offset,
        want: reference(reduce_op::SUM, &inputs),
    };
    case.check(&node, "all_reduce 32 MiB");
}

/// One call of `pull_collectives` on a rank: `(rank, ctx, node)` to its status.
type Call = Box<dyn Fn(usize, i64, &Node) -> i32 + Sync>;
/// Its check after the launch: `(node, what)`.
type Check = Box<dyn Fn(&Node, &str) + Sync>;

/// A `Call` of `api(ctx, src, dst)` on the addresses of `inp` and `out` in the calling rank's
/// heap.
fn in_out_call(
    inp: usize,
    out: usize,
    api: impl Fn(i64, i64, i64) -> i32 + Sync + 'static,
) -> Call {
    Box::new(move |rank, ctx, node| api(ctx, node.addr(rank, inp), node.addr(rank, out)))
}

/// Reduce-scatter, all-gather, broadcast, reduce and all-to-all, every dtype (and op where one
/// applies), in one launch per configuration. `gather_ll`: force all_gather / reduce_scatter
/// over LL packets (true, with a scratch large enough for every size) or over the buffers
/// (false); None keeps the default limit, so small cases go over LL and larger ones do not.
fn pull_collectives(world: usize, ctas: u32, threads: u32, gather_ll: Option<bool>) {
    let sizes = [1usize, 5, 64, 301];
    let scratch = if gather_ll == Some(true) {
        32 << 20
    } else {
        1 << 20
    };
    let mut node = Node::new(world, 4 << 20, scratch);
    if let Some(ll) = gather_ll {
        for r in 0..world {
            node.ctx_mut(r).gather_ll_max_bytes = if ll { u64::MAX } else { 0 };
        }
        for n in sizes {
            let bytes = n * 4;
            let got = use_ll(node.context(0), ctas as usize, world * bytes, bytes);
            assert_eq!(
                got, ll,
                "world {world}, {ctas} CTAs, blocks of {bytes} bytes"
            );
        }
    }
    let mut layout = Layout::new();
    let mut rng = Rng::new(77 + world as u64);
    let mut calls: Vec<(String, Call, Check)> = Vec::new();
    for dt in Dt::ALL {
        for (k, &n) in sizes.iter().enumerate() {
            let skew = if k % 2 == 1 { dt.size() } else { 0 };
            let bytes = n * dt.size();
            for op in OPS {
                // reduce_scatter: in = world blocks, out = n elements.
                let inp = layout.take(world * bytes, skew);
                let out = layout.take(bytes, 0);
                let ins = fill_every_rank(&mut node, &mut rng, inp, dt, op, world * n);
                let wants = block_references(op, &ins, n);
                calls.push((
                    format!("reduce_scatter {dt:?} op={op} n={n}"),
                    in_out_call(inp, out, move |ctx, src, dst| {
                        api::symm_reduce_scatter(ctx, src, dst, n as i64, op, dt.code())
                    }),
                    Box::new(move |node, what| {
                        for (r, want) in wants.iter().enumerate() {
                            assert_close(
                                &format!("{what} rank {r}"),
                                dt,
                                &read(node, r, out, dt, n),
                                want,
                            );
                        }
                    }),
                ));
                // reduce to a root.
                let root = (n + op as usize) % world;
                let inp = layout.take(bytes, skew);
                let out = layout.take(bytes, 0);
                let want = reference(op, &fill_every_rank(&mut node, &mut rng, inp, dt, op, n));
                calls.push((
                    format!("reduce {dt:?} op={op} n={n} root={root}"),
                    in_out_call(inp, out, move |ctx, src, dst| {
                        api::symm_reduce(ctx, src, dst, n as i64, op, dt.code(), root as i32)
                    }),
                    Box::new(move |node, what| {
                        assert_close(what, dt, &read(node, root, out, dt, n), &want);
                        for r in (0..node.world).filter(|r| *r != root) {
                            let untouched =
                                node.heap(r)[out..out + bytes].iter().all(|b| *b == GUARD);
                            assert!(
                                untouched,
                                "{what}: rank {r} (not the root) had its output written"
                            );
                        }
                    }),
                ));
            }
            // all_gather (out of place, and in place).
            for in_place in [false, true] {
                let out = layout.take(world * bytes, skew);
                let mut ins = Vec::new();
                let inp = if in_place {
                    usize::MAX
                } else {
                    layout.take(bytes, skew)
                };
                for r in 0..world {
                    let at = if in_place { out + r * bytes } else { inp };
                    ins.push(fill(&mut node, r, at, dt, &random_inputs(&mut rng, 0, n)));
                }
                let want: Vec<f64> = ins.concat();
                calls.push((
                    format!("all_gather {dt:?} n={n} in_place={in_place}"),
                    Box::new(move |rank, ctx, node| {
                        let src = if in_place { out + rank * bytes } else { inp };
                        api::symm_all_gather(
                            ctx,
                            node.addr(rank, src),
                            node.addr(rank, out),
                            n as i64,
                            dt.code(),
                        )
                    }),
                    Box::new(move |node, what| {
                        for r in 0..node.world {
                            let got = read(node, r, out, dt, world * n);
                            assert!(got == want, "{what}: rank {r} gathered the wrong values");
                        }
                    }),
                ));
            }
            // broadcast.
            let root = n % world;
            let buf = layout.take(bytes, skew);
            let want = fill_every_rank(&mut node, &mut rng, buf, dt, 0, n).swap_remove(root);
            calls.push((
                format!("broadcast {dt:?} n={n} root={root}"),
                Box::new(move |rank, ctx, node| {
                    api::symm_broadcast(ctx, node.addr(rank, buf), n as i64, dt.code(), root as i32)
                }),
                Box::new(move |node, what| {
                    for r in 0..node.world {
                        assert!(
                            read(node, r, buf, dt, n) == want,
                            "{what}: rank {r} has the wrong values"
                        );
                    }
                }),
            ));
            // all_to_all.
            let inp = layout.take(world * bytes, skew);
            let out = layout.take(world * bytes, skew);
            let ins = fill_every_rank(&mut node, &mut rng, inp, dt, 0, world * n);
            calls.push((
                format!("all_to_all {dt:?} n={n}"),
                in_out_call(inp, out, move |ctx, src, dst| {
                    api::symm_all_to_all(ctx, src, dst, n as i64, dt.code())
                }),
                Box::new(move |node, what| {
                    for r in 0..node.world {
                        let want: Vec<f64> = (0..node.world)
                            .flat_map(|p| ins[p][r * n..(r + 1) * n].to_vec())
                            .collect();
                        assert!(
                            read(node, r, out, dt, world * n) == want,
                            "{what}: rank {r} has the wrong blocks"
                        );
                    }
                }),
            ));
        }
    }
    let label = format!("pull collectives world={world} ctas={ctas} threads={threads}");
    let failures = std::sync::Mutex::new(Vec::new());
    let st = node.run(&label, ctas, threads, |rank, ctx| {
        first_failure(&calls, |(name, call, _)| {
            let s = call(rank, ctx, &node);
            if s != status::OK {
                failures
                    .lock()
                    .unwrap()
                    .push(format!("{name}: rank {rank} status {s}"));
            }
            s
        })
    });
    assert_eq!(
        st,
        vec![status::OK; world],
        "{label}: {:?}",
        failures.lock().unwrap()
    );
    for (name, _, check) in &calls {
        check(&node, &format!("{label} {name}"));
    }
    layout.check_guards(&node, &label);
}

#[test]
fn pull_collectives_world2() {
    pull_collectives(2, 2, 32, None);
}

#[test]
fn pull_collectives_world3() {
    pull_collectives(3, 1, 64, None);
}

#[test]
fn pull_collectives_world4() {
    pull_collectives(4, 3, 32, None);
}

#[test]
fn pull_collectives_world8() {
    pull_collectives(8, 2, 32, None);
}

#[test]
fn gather_scatter_ll_only() {
    pull_collectives(3, 2, 32, Some(true));
    pull_collectives(8, 3, 32, Some(true));
}

#[test]
fn gather_scatter_bulk_only() {
    pull_collectives(4, 2, 32, Some(false));
}

/// Many calls in a row, alternating both all-reduce algorithms, starting just below the epoch
/// counter's wrap-around so that it wraps in the middle.
#[test]
fn back_to_back_calls_across_epoch_wrap() {
    for start in [0u32, (1 << 30) - 5] {
        let world = 4;
        let mut node = Node::new(world, 4 << 20, 1 << 20);
        node.set_epochs(start);
        let mut layout = Layout::new();
        let mut rng = Rng::new(start as u64 + 5);
        let mut cases = Vec::new();
        for k in 0..24 {
            let n = if k % 3 == 2 { 2000 } else { 40 + k };
            let offset = layout.take(n * 4, 0);
            let inputs = fill_every_rank(&mut node, &mut rng, offset, Dt::F32, 0, n);
            cases.push((n, offset, reference(reduce_op::SUM, &inputs)));
        }
        let label = format!("back to back from epoch {start}");
        run_all_ok(&node, &label, 2, 32, &cases, |rank, ctx, (n, offset, _)| {
            api::symm_all_reduce(
                ctx,
                node.addr(rank, *offset),
                0,
                *n as i64,
                reduce_op::SUM,
                dtype::FLOAT32,
            )
        });
        for (k, (n, offset, want)) in cases.iter().enumerate() {
            assert_close(
                &format!("{label} call {k}"),
                Dt::F32,
                &read(&node, 1, *offset, Dt::F32, *n),
                want,
            );
        }
    }
}

/// A node whose scratch slices give `store_rounds` `units_per_box` units per sender and round
/// (so calls take many rounds and reuse every buffer), its round counters at `rounds_before`.
fn push_node(world: usize, units_per_box: usize, rounds_before: u32) -> Node {
    use ironlink_device::transport::store_rounds::{capacity, BUFFERS};
    // `BUFFERS` buffers per slice, `world - 1` boxes per buffer.
    let scratch = ironlink_device::abi::MAX_CTAS * BUFFERS * 16 * (world - 1) * units_per_box;
    let mut node = Node::new(world, 2 << 20, scratch);
    node.set_round_counters(rounds_before);
    assert_eq!(capacity(node.context(0), world), units_per_box);
    node
}

/// The one-shot LL all-reduce of `LL_AFTER` f32 at `offset` that the push tests run after every
/// case: it writes the same scratch slices without an entry barrier of its own.
fn ll_after(node: &Node, rank: usize, handle: i64, offset: usize) -> i32 {
    let at = node.addr(rank, offset);
    api::symm_all_reduce(handle, at, 0, LL_AFTER, reduce_op::SUM, dtype::FLOAT32)
}

/// One case of a push test on one rank: `case` on the rank's context, then `ll_after`; the
/// first failing status, or OK.
fn case_then_ll(
    node: &Node,
    rank: usize,
    handle: i64,
    ll_offset: usize,
    case: impl FnOnce(&ironlink_device::abi::SymmContext) -> Result<(), i32>,
) -> i32 {
    match ironlink_device::runtime::context::context(handle).and_then(case) {
        Ok(()) => ll_after(node, rank, handle, ll_offset),
        Err(s) => s,
    }
}

const LL_AFTER: i64 = 64;

/// `all_reduce::two_shot_by_stores` on its own (the dispatcher uses it from `PUSH_MIN_BYTES` on, too
/// large to simulate often): scratch slices of a few units per sender, so calls take many rounds
/// and every buffer is reused; one launch runs every case back to back, each followed by a
/// one-shot LL all-reduce that writes the same scratch slices (the entry barrier must order the
/// two).
fn two_shot_by_stores_matrix(
    world: usize,
    ctas: u32,
    threads: u32,
    units_per_box: usize,
    rounds_before: u32,
) {
    use ironlink_device::collectives::all_reduce;
    use ironlink_device::runtime::elem::Reduction;
    use ironlink_device::runtime::sync;
    use ironlink_device::transport::store_rounds;
    let mut node = push_node(world, units_per_box, rounds_before);
    let mut layout = Layout::new();
    let ll_offset = layout.take(4 * LL_AFTER as usize, 0);
    let mut rng = Rng::new(world as u64 * 77 + ctas as u64);
    let mut cases = Vec::new();
    for dt in Dt::ALL {
        for op in OPS {
            for n in [1usize, 9, 100, 1001, 4099] {
                let offset = layout.take(n * dt.size(), 0);
                let inputs = fill_every_rank(&mut node, &mut rng, offset, dt, op, n);
                cases.push(ArCase {
                    dt,
                    op,
                    n,
                    offset,
                    want: reference(op, &inputs),
                });
            }
        }
    }
    assert!(store_rounds::usable(
        node.context(0),
        &Region {
            offset: cases[0].offset,
            bytes: 16
        }
    ));
    let label = format!(
        "two_shot_by_stores world={world} ctas={ctas} threads={threads} box={units_per_box}"
    );
    run_all_ok(&node, &label, ctas, threads, &cases, |rank, handle, c| {
        case_then_ll(&node, rank, handle, ll_offset, |cx| {
            let r = Region::new(
                cx,
                node.addr(rank, 0),
                c.offset as i64,
                c.n as i64,
                c.dt.size(),
            )?;
            let call = sync::Call::begin(cx, 0)?;
            all_reduce::two_shot_by_stores(
                &call,
                &r,
                &Reduction {
                    op: c.op,
                    dtype: c.dt.code(),
                },
            )
        })
    });
    for c in &cases {
        c.check(&node, &format!("{label} {:?} op={} n={}", c.dt, c.op, c.n));
    }
    layout.check_guards(&node, &label);
}

#[test]
fn two_shot_by_stores_rounds() {
    two_shot_by_stores_matrix(2, 1, 32, 8, 0);
    two_shot_by_stores_matrix(3, 2, 32, 5, 0);
    two_shot_by_stores_matrix(4, 3, 64, 16, 0);
    two_shot_by_stores_matrix(8, 2, 32, 3, 0);
}

/// The round counters wrap around u32 in the middle of the calls (flag waits compare in
/// wrapping arithmetic).
#[test]
fn two_shot_by_stores_across_counter_wrap() {
    two_shot_by_stores_matrix(3, 2, 32, 5, u32::MAX - 40);
}

/// `reduce_scatter::by_stores` on its own (the dispatcher uses it from
/// `PUSH_REDUCE_SCATTER_MIN_BYTES` of input), with the same tiny scratch as above: out of place
/// and in place (output = own block), each case followed by a one-shot LL all-reduce on the same
/// scratch slices.
fn push_reduce_scatter_matrix(world: usize, ctas: u32, threads: u32, units_per_box: usize) {
    use ironlink_device::collectives::reduce_scatter;
    use ironlink_device::runtime::elem::Reduction;
    use ironlink_device::runtime::sync;
    use ironlink_device::transport::store_rounds;
    let mut node = push_node(world, units_per_box, 0);
    let mut layout = Layout::new();
    let ll_offset = layout.take(4 * LL_AFTER as usize, 0);
    let mut rng = Rng::new(world as u64 * 91 + ctas as u64);
    // (dtype, op, n per block, input offset, output offset, per-rank wanted output)
    let mut cases = Vec::new();
    for dt in Dt::ALL {
        for op in OPS {
            for (k, n) in [8usize, 96, 1000].into_iter().enumerate() {
                let input = layout.take(world * n * dt.size(), 0);
                let in_place = k % 2 == 1;
                let out = if in_place {
                    usize::MAX
                } else {
                    layout.take(n * dt.size(), 0)
                };
                let inputs = fill_every_rank(&mut node, &mut rng, input, dt, op, world * n);
                let want = block_references(op, &inputs, n);
                cases.push((dt, op, n, input, out, want));
            }
        }
    }
    let label = format!(
        "push reduce_scatter world={world} ctas={ctas} threads={threads} box={units_per_box}"
    );
    run_all_ok(
        &node,
        &label,
        ctas,
        threads,
        &cases,
        |rank, handle, case| {
            let (dt, op, n, input, out, _) = case;
            let bytes = n * dt.size();
            let out = if *out == usize::MAX {
                input + rank * bytes
            } else {
                *out
            };
            case_then_ll(&node, rank, handle, ll_offset, |cx| {
                let i = Region::new(
                    cx,
                    node.addr(rank, 0),
                    *input as i64,
                    (world * n) as i64,
                    dt.size(),
                )?;
                let o = Region::new(cx, node.addr(rank, 0), out as i64, *n as i64, dt.size())?;
                assert!(store_rounds::usable_for_reduce_scatter(cx, &i, &o));
                let call = sync::Call::begin(cx, 0)?;
                reduce_scatter::by_stores(
                    &call,
                    &i,
                    &o,
                    &Reduction {
                        op: *op,
                        dtype: dt.code(),
                    },
                )
            })
        },
    );
    for (dt, op, n, input, out, want) in &cases {
        for (r, want) in want.iter().enumerate() {
            let at = if *out == usize::MAX {
                input + r * n * dt.size()
            } else {
                *out
            };
            let what = format!("{label} {dt:?} op={op} n={n} rank {r}");
            assert_close(&what, *dt, &read(&node, r, at, *dt, *n), want);
        }
    }
    layout.check_guards(&node, &label);
}

#[test]
fn push_reduce_scatter_rounds() {
    push_reduce_scatter_matrix(2, 1, 32, 8);
    push_reduce_scatter_matrix(3, 2, 32, 5);
    push_reduce_scatter_matrix(4, 3, 64, 16);
    push_reduce_scatter_matrix(8, 2, 32, 3);
}
