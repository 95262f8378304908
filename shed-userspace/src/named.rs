// SPDX-License-Identifier: MIT OR Apache-2.0
//! Options with a fixed set of names (a reject action, a hook, a limiter):
//! one name each, the same on the command line, in the config file, in JSON
//! and in logs. The CLI builds its parsers and completions from [`Named`], so
//! only the CLI layer knows clap.

/// A value of a fixed set, each with its name and a line of help.
pub(crate) trait Named: Copy + PartialEq + Send + Sync + 'static {
    /// Every value, in the order help lists them.
    const ALL: &'static [Self];
    fn name(self) -> &'static str;
    fn help(self) -> &'static str;

    /// The value called `name`, if any.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == name)
    }
}
