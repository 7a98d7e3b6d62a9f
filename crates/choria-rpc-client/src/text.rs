//! Text from configuration files and the network, made safe to show in an error.

/// Text from a configuration file or the environment for a message: control characters
/// escaped, at most 128 characters. Also what protocol errors quote of a peer's text.
pub(crate) fn bounded(text: &str) -> String {
    const MAX: usize = 128;
    let mut out: String = text
        .chars()
        .take(MAX)
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect();
    if text.chars().count() > MAX {
        out.push_str("...");
    }
    out
}
