//! The switches of the deliberately broken variants: each sits in the protocol step it breaks
//! and names, in its doc comment, the model or regression shown to fail on it (`.ci/run`
//! requires each failure).

/// Whether the deliberately broken variant `name` is switched on for this loom run (the
/// environment variable `name` is `1`). Loom only.
#[cfg(loom)]
pub(crate) fn broken_variant(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v == "1")
}

/// [`broken_variant`] where the code is also built outside loom: whether the loom-only broken
/// variant `name` is switched on; never outside loom (a constant `false` there).
#[inline(always)]
pub(crate) fn loom_broken(name: &str) -> bool {
    #[cfg(loom)]
    {
        broken_variant(name)
    }
    #[cfg(not(loom))]
    {
        let _ = name;
        false
    }
}

/// A broken variant's switch on real threads (feature `testing` only, `false` otherwise):
/// whether `$name=1` is set, read once per call site.
macro_rules! test_switch {
    ($name:literal) => {{
        #[cfg(feature = "testing")]
        {
            static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            *ON.get_or_init(|| std::env::var_os($name).is_some_and(|v| v == "1"))
        }
        #[cfg(not(feature = "testing"))]
        {
            false
        }
    }};
}
pub(crate) use test_switch;
