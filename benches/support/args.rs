//! Command-line values of the bench binaries that take them (`-- --name value`).

/// The value after `name` on the command line, parsed; `None` when absent or not a `T`.
/// Everything else (`cargo bench` passes `--bench`) is ignored.
pub fn arg<T: std::str::FromStr>(name: &str) -> Option<T> {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2)
        .find(|w| w[0] == name)
        .and_then(|w| w[1].parse().ok())
}
