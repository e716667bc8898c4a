/// Defines the exported `extern "C"` device functions and, from the same tokens, the `EXPORTS`
/// signature table (name, argument names and types, return type, doc line). The Python wrappers
/// are generated from that table, so a function and its Python signature cannot drift apart.
///
/// Only the scalar types Triton's extern calls pass are allowed: `i32` and `i64`.
macro_rules! exports {
    ($(
        #[doc = $doc:literal]
        $(#[doc = $more:literal])*
        fn $name:ident($($arg:ident : $ty:ident),* $(,)?) -> $ret:ident $body:block
    )*) => {
        $(
            #[doc = $doc]
            $(#[doc = $more])*
            #[no_mangle]
            pub extern "C" fn $name($($arg: $ty),*) -> $ret $body
        )*

        /// Every exported device function, in definition order.
        pub const EXPORTS: &[$crate::abi::FnSig] = &[$(
            $crate::abi::FnSig {
                name: stringify!($name),
                args: &[$((stringify!($arg), exports!(@ty $ty))),*],
                ret: exports!(@ty $ret),
                doc: $doc,
            }
        ),*];
    };
    (@ty i32) => { "i32" };
    (@ty i64) => { "i64" };
}
