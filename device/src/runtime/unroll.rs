//! `for_each_rank!`: a loop over the rank indices 0..MAX_RANKS that the macro unrolls itself;
//! `unroll2!` the same over 0..n for n <= 2 (units a thread has in flight, groups of ranks).
//!
//! Register arrays indexed by a loop variable the compiler leaves rolled end up in local memory
//! (`.local`, a stack frame); with constant indices they stay in registers.

/// Runs `$body` with `$p` bound to each constant 0..MAX_RANKS.
macro_rules! for_each_rank {
    ($p:ident => $body:stmt) => {{
        const _: () = assert!(crate::abi::MAX_RANKS == 8);
        {
            let $p: usize = 0;
            $body
        }
        {
            let $p: usize = 1;
            $body
        }
        {
            let $p: usize = 2;
            $body
        }
        {
            let $p: usize = 3;
            $body
        }
        {
            let $p: usize = 4;
            $body
        }
        {
            let $p: usize = 5;
            $body
        }
        {
            let $p: usize = 6;
            $body
        }
        {
            let $p: usize = 7;
            $body
        }
    }};
}

/// Runs `$body` with `$k` bound to each constant 0..$n, for `$n` at most 2.
macro_rules! unroll2 {
    ($n:expr, $k:ident => $body:stmt) => {{
        {
            let $k: usize = 0;
            if $k < $n {
                $body
            }
        }
        {
            let $k: usize = 1;
            if $k < $n {
                $body
            }
        }
    }};
}
