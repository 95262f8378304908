// SPDX-License-Identifier: MIT OR Apache-2.0
//! An audit line for every live change. `shedctl set`, `tier` and `detach`
//! note who asks (uid, pid, the command line) in a file beside the pid file
//! just before they write the maps; the daemon, which sees every change
//! whoever makes it, compares the settings each tick and logs one line per
//! change with the old and new values and that note (journald keeps it under
//! systemd).
use std::{collections::BTreeMap, fmt::Write as _, fs};

use shed_common::{ControlConfig, PortConfig, tier};

use crate::named::Named as _;
use crate::{
    control::Algo,
    host::paths,
    kernel::options::{Action, Count},
    kernel::options::{Cidr, tier_name},
};

/// Notes the operator's request for the daemon's audit line (best effort: a
/// change is never refused because it could not be noted).
pub(crate) fn note_request() {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let command: Vec<String> = std::env::args().collect();
    let note = format!("uid={uid} pid={} command=\"{}\"", std::process::id(), command.join(" "));
    let _ = fs::write(paths::REQUEST_NOTE, note);
}

/// The last request noted (or that none was: a change by another tool).
pub(crate) fn last_request() -> String {
    fs::read_to_string(paths::REQUEST_NOTE)
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "unknown (no shedctl request noted)".to_owned())
}

/// Reads what the audit compares (ports with their settings, and tiers).
pub(crate) fn read(maps: &crate::kernel::maps::GateMaps) -> Result<Settings, crate::error::Error> {
    let mut ports = BTreeMap::new();
    for (port, config) in maps.port_configs()? {
        ports.insert(port, (config, maps.control(config.slot)?));
    }
    Ok(Settings { ports, tiers: maps.tier_entries()? })
}

/// The settings the daemon compares between ticks.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Settings {
    pub ports: BTreeMap<u16, (PortConfig, ControlConfig)>,
    pub tiers: BTreeMap<Cidr, u8>,
}

/// What changed from `old` to `new`, one entry per port or tier network
/// (subject, "field old -> new, ..."); empty when nothing did.
pub(crate) fn changes(old: &Settings, new: &Settings) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (port, (config, control)) in &new.ports {
        let Some((was, was_control)) = old.ports.get(port) else { continue };
        let mut what = String::new();
        let mut field = |name: &str, a: String, b: String| {
            if a != b {
                let _ = write!(what, "{}{name} {a} -> {b}", if what.is_empty() { "" } else { ", " });
            }
        };
        field("action", Action::from_raw(was.action).to_string(), Action::from_raw(config.action).to_string());
        let on = |v: u8| if v != 0 { "on".to_owned() } else { "off".to_owned() };
        field("dry-run", on(was.dry_run), on(config.dry_run));
        field("count", Count::from_raw(was.count_mode).name().into(), Count::from_raw(config.count_mode).name().into());
        field("client-cap", was.client_cap.to_string(), config.client_cap.to_string());
        field("client-share", was.client_share.to_string(), config.client_share.to_string());
        for t in 1..tier::COUNT {
            let share = |p: &PortConfig| format!("{}", f64::from(p.share_permille[t]) / 1000.0);
            field(&format!("share {}", tier_name(t as u8)), share(was), share(config));
            let action = |p: &PortConfig| match p.tier_action[t] {
                tier::ACTION_DEFAULT => "port's".to_owned(),
                raw => Action::from_raw(raw).to_string(),
            };
            field(&format!("tier-action {}", tier_name(t as u8)), action(was), action(config));
        }
        field("algo", Algo::from_raw(was_control.algo).to_string(), Algo::from_raw(control.algo).to_string());
        field("min-limit", was_control.min_limit.to_string(), control.min_limit.to_string());
        field("max-limit", was_control.max_limit.to_string(), control.max_limit.to_string());
        if control.generation != was_control.generation && control.requested_limit != 0 {
            let _ = write!(what, "{}limit set to {}", if what.is_empty() { "" } else { ", " }, control.requested_limit);
        }
        if !what.is_empty() {
            out.push((format!("port {port}"), what));
        }
    }
    for port in old.ports.keys().filter(|p| !new.ports.contains_key(p)) {
        out.push((format!("port {port}"), "detached".to_owned()));
    }
    let name = |t: Option<&u8>| t.map_or("none".to_owned(), |&t| tier_name(t).to_owned());
    let networks: std::collections::BTreeSet<&Cidr> = old.tiers.keys().chain(new.tiers.keys()).collect();
    for cidr in networks {
        let (a, b) = (old.tiers.get(cidr), new.tiers.get(cidr));
        if a != b {
            out.push((format!("tier {cidr}"), format!("{} -> {}", name(a), name(b))));
        }
    }
    out
}

/// Logs each change with who asked for it.
pub(crate) fn log_changes(old: &Settings, new: &Settings) {
    let changes = changes(old, new);
    if changes.is_empty() {
        return;
    }
    let by = last_request();
    for (subject, what) in changes {
        tracing::info!(subject = %subject, change = %what, by = %by, "operator change");
    }
}

#[cfg(test)]
mod tests {
    use shed_common::{action, count_mode};

    use super::*;

    fn port(action: u8) -> (PortConfig, ControlConfig) {
        (
            PortConfig::new(0, action, false, count_mode::WORK),
            ControlConfig { generation: 1, min_limit: 4, max_limit: 100, ..ControlConfig::default() },
        )
    }

    #[test]
    fn each_change_is_named_with_its_old_and_new_value() {
        let mut old = Settings::default();
        old.ports.insert(8080, port(action::DROP));
        old.ports.insert(9090, port(action::DROP));
        assert!(changes(&old, &old).is_empty(), "nothing changed, nothing said");
        let mut new = old.clone();
        let (config, control) = new.ports.get_mut(&8080).unwrap();
        config.action = action::RST;
        config.dry_run = 1;
        config.share_permille[tier::LOW as usize] = 600;
        control.max_limit = 50;
        control.generation = 2;
        control.requested_limit = 20;
        new.ports.remove(&9090);
        new.tiers.insert(crate::cli::tiers::parse_cidr("10.0.0.0/8").unwrap(), tier::CRITICAL);
        let said = changes(&old, &new);
        assert_eq!(said.len(), 3, "{said:?}");
        assert_eq!(said[0].0, "port 8080");
        assert_eq!(
            said[0].1,
            "action drop -> rst, dry-run off -> on, share low 0.7 -> 0.6, max-limit 100 -> 50, limit set to 20"
        );
        assert_eq!(said[1], ("port 9090".to_owned(), "detached".to_owned()));
        assert_eq!(said[2], ("tier 10.0.0.0/8".to_owned(), "none -> critical".to_owned()));
    }
}
