//! The export table's macros: `exports!` defines a group of exported functions and its signature
//! table, `which!` names a function by its index in the joined table (`api::EXPORTS`).

/// Defines a group of exported `extern "C"` device functions and, from the same tokens, the
/// group's `EXPORTS` signature table (name, argument names and types, return type, doc line;
/// `api::EXPORTS` joins the groups'). The Python wrappers are generated from that table, so a
/// function and its Python signature cannot drift apart.
///
/// Only the scalar types Triton's extern calls pass are allowed: `i32` and `i64`.
///
/// `exports! { cfg(PREDICATE); ... }` compiles the functions only where PREDICATE holds but keeps
/// the table everywhere: the NVSHMEM wrappers exist only in the NVSHMEM bitcode, while build.rs
/// (a host build) still generates their Python wrappers from the table.
macro_rules! exports {
    (cfg($when:meta); $(
        #[doc = $doc:literal]
        $(#[doc = $more:literal])*
        fn $name:ident($($arg:ident : $ty:ident),* $(,)?) -> $ret:ident $body:block
    )*) => {
        $(
            #[doc = $doc]
            $(#[doc = $more])*
            #[cfg($when)]
            #[no_mangle]
            pub extern "C" fn $name($($arg: $ty),*) -> $ret $body
        )*

        /// This group's exported device functions, in definition order.
        pub const EXPORTS: &[$crate::abi::FnSig] = &[$(
            $crate::abi::FnSig {
                name: stringify!($name),
                args: &[$((stringify!($arg), exports!(@ty $ty))),*],
                ret: exports!(@ty $ret),
                doc: $doc,
            }
        ),*];
    };
    ($(
        #[doc = $doc:literal]
        $(#[doc = $more:literal])*
        fn $name:ident($($arg:ident : $ty:ident),* $(,)?) -> $ret:ident $body:block
    )*) => {
        exports! { cfg(all()); $(
            #[doc = $doc]
            $(#[doc = $more])*
            fn $name($($arg: $ty),*) -> $ret $body
        )* }
    };
    (@ty i32) => { "i32" };
    (@ty i64) => { "i64" };
}

/// The position of `name` in `EXPORTS` (recorded with errors so the host can name the function).
macro_rules! which {
    ($name:ident) => {{
        const W: i32 = $crate::api::export_macro::export_index(stringify!($name));
        const _: () = assert!(W >= 0, "which! names a function that is not exported");
        W
    }};
}

/// `a == b` for `const` evaluation.
const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The position of `name` in `EXPORTS`, or -1 (for `which!`, at compile time).
pub(super) const fn export_index(name: &str) -> i32 {
    let mut i = 0;
    while i < super::EXPORTS.len() {
        if str_eq(super::EXPORTS[i].name, name) {
            return i as i32;
        }
        i += 1;
    }
    -1
}
