//! `for_each_rank!`: a loop over the rank indices 0..MAX_RANKS that the macro unrolls itself;
//! `unroll2!` the same over 0..n for n <= 2 (units a thread has in flight, groups of ranks);
//! `unroll4!` over 0..n for n <= 4 (the LL packets a thread has in flight).
//!
//! Register arrays indexed by a loop variable the compiler leaves rolled end up in local memory
//! (`.local`, a stack frame); with constant indices they stay in registers.

/// Runs `$body` with `$k` bound to each of the constants `$c`, in order (with `if $cond`, only
/// where `$cond` holds for that constant).
macro_rules! for_each_constant {
    ($k:ident in [$($c:literal),*] => $body:stmt) => {{
        $({
            let $k: usize = $c;
            $body
        })*
    }};
    ($k:ident in [$($c:literal),*] if $cond:expr => $body:stmt) => {{
        $({
            let $k: usize = $c;
            if $cond {
                $body
            }
        })*
    }};
}

/// Runs `$body` with `$p` bound to each constant 0..MAX_RANKS.
macro_rules! for_each_rank {
    ($p:ident => $body:stmt) => {{
        const _: () = assert!(crate::abi::MAX_RANKS == 8);
        for_each_constant!($p in [0, 1, 2, 3, 4, 5, 6, 7] => $body)
    }};
}

/// Runs `$body` with `$k` bound to each constant 0..$n, for `$n` at most 2.
macro_rules! unroll2 {
    ($n:expr, $k:ident => $body:stmt) => {
        for_each_constant!($k in [0, 1] if $k < $n => $body)
    };
}

/// Runs `$body` with `$k` bound to each constant 0..$n, for `$n` at most 4.
macro_rules! unroll4 {
    ($n:expr, $k:ident => $body:stmt) => {
        for_each_constant!($k in [0, 1, 2, 3] if $k < $n => $body)
    };
}
