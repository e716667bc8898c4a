//! The tutorial's lesson 3 (examples/tutorial/03_barrier.py), in the simulator: a producer stores
//! a row of data into a peer's memory and then stores a flag; the consumer waits for the flag and
//! reads the row. With a RELAXED flag store the row can arrive after the flag, and the consumer
//! reads stale data; with a RELEASE flag store it never can.
//!
//! What this shows, exactly. The simulator's memory is stronger than a GPU's (x86, every access an
//! atomic), so on its own it never reorders the two stores: the first test shows the relaxed
//! handoff passing there. `sim_faults::Fault::ReorderStores` then models the one reordering the
//! GPU's memory model permits here: a plain store overtaken by the same thread's later relaxed
//! store (made to land `DELAY_US` late, so the consumer reliably sees the gap), while a release
//! store delivers every earlier store first. Under it the relaxed handoff gives wrong answers and
//! the release one none. It demonstrates the rule; it does not discover GPU behaviour (the GPU
//! side of the same rule is read in the PTX: atom.release / ld.acquire in the lesson's kernel).
//! The consumer side uses acquire loads throughout: a relaxed flag LOAD followed by early data
//! loads is the mirror-image bug, which the simulator cannot model (its loads are never early).

use ironlink_device::hw::{self, sim_faults};
use sim_faults::Fault;

const ROW: usize = 256; // u32 words the producer writes per round
const ROUNDS: u32 = 20;
const DELAY_US: u64 = 2000;
const SPIN_LIMIT_NS: u64 = 10_000_000_000;

#[derive(Clone, Copy, PartialEq)]
enum FlagStore {
    Relaxed,
    Release,
}

/// Spins until `*p == want` (acquire loads), or panics after SPIN_LIMIT_NS.
fn wait_for(p: *const u32, want: u32, what: &str) {
    let start = hw::now_ns();
    // SAFETY: p points into the test's live buffer, aligned.
    while unsafe { hw::load_acquire_u32(p) } != want {
        assert!(
            hw::now_ns() - start < SPIN_LIMIT_NS,
            "{what} never reached {want}"
        );
        hw::spin_pause();
    }
}

/// Runs ROUNDS handoffs from rank 0 to rank 1 (one thread each) under `plan`; returns the rounds
/// in which the consumer read at least one stale word, and how many stores were overtaken.
fn handoffs(order: FlagStore, plan: Option<Fault>) -> (u32, u64) {
    let _serial = sim_faults::serial();
    let mut row = vec![0u32; ROW];
    let mut flags = [0u32; 2]; // [0]: the producer's "round k is written", [1]: the consumer's ack
    let (row_addr, flag_addr) = (row.as_mut_ptr() as usize, flags.as_mut_ptr() as usize);
    let stale_rounds = std::sync::atomic::AtomicU32::new(0);
    sim_faults::set(plan);
    hw::launch("tutorial ordering", 2, 1, 1, |rank| {
        let (row, flag) = (row_addr as *mut u32, flag_addr as *mut u32);
        for k in 1..=ROUNDS {
            // SAFETY: indices below ROW and 2 of the buffers above, which outlive the launch.
            unsafe {
                if rank == 0 {
                    for i in 0..ROW {
                        hw::store_u32(row.add(i), k); // the data: plain stores
                    }
                    match order {
                        FlagStore::Relaxed => hw::store_relaxed_u32(flag, k), // WRONG
                        FlagStore::Release => hw::store_release_u32(flag, k), // right
                    }
                    wait_for(flag.add(1), k, "the consumer's ack");
                } else {
                    wait_for(flag, k, "the producer's flag");
                    if (0..ROW).any(|i| hw::load_u32(row.add(i)) != k) {
                        stale_rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    hw::store_release_u32(flag.add(1), k);
                }
            }
        }
    });
    let overtaken = sim_faults::overtaken();
    sim_faults::set(None);
    assert_eq!(row, vec![ROUNDS; ROW], "every store landed in the end");
    (stale_rounds.into_inner(), overtaken)
}

#[test]
fn relaxed_flag_passes_in_the_plain_simulator() {
    // Why the simulator needs the fault: without it, the wrong version looks right.
    assert_eq!(handoffs(FlagStore::Relaxed, None), (0, 0));
}

#[test]
fn relaxed_flag_lets_the_consumer_read_stale_data() {
    let (stale, overtaken) = handoffs(
        FlagStore::Relaxed,
        Some(Fault::ReorderStores { delay_us: DELAY_US }),
    );
    assert_eq!(
        overtaken,
        u64::from(ROUNDS) * ROW as u64,
        "every data store was overtaken by its flag"
    );
    assert!(
        stale > 0,
        "the relaxed flag never exposed stale data in {ROUNDS} rounds"
    );
    eprintln!("relaxed flag store: the consumer read stale data in {stale} of {ROUNDS} rounds");
}

#[test]
fn release_flag_never_lets_the_consumer_read_stale_data() {
    let (stale, overtaken) = handoffs(
        FlagStore::Release,
        Some(Fault::ReorderStores { delay_us: DELAY_US }),
    );
    assert_eq!(
        (stale, overtaken),
        (0, 0),
        "a release store must deliver every earlier store first"
    );
}
