// SPDX-License-Identifier: MIT OR Apache-2.0
//! Client tiers: parsing and checking what operators write (CIDRs, tier
//! names, shares, tier files). Pure functions; the maps are written elsewhere.
//!
//! Tiers are assigned server-side from the source address by longest-prefix
//! match; unlisted sources are `normal`. Each tier admits while in-flight is
//! below its share of the limit (critical 100%, normal 90%, low 70% by
//! default), so the lowest tier is shed first as in-flight nears the limit.
//! Anti-starvation rule: while in-flight is below the whole limit, one in 16
//! SYNs that a full share would reject is admitted anyway, so no tier is shut
//! out entirely. `exempt` sources are always admitted and never counted.
use std::{collections::BTreeMap, net::IpAddr, path::Path};

use shed_common::{ipv4_mapped, tier};

use crate::kernel::options::{Action, Cidr, tier_name};

/// Parses `10.0.0.0/8`, `2001:db8::/32`, or a bare address (a /32 or /128).
pub fn parse_cidr(s: &str) -> Result<Cidr, String> {
    let s = s.trim();
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip: IpAddr =
        addr.parse().map_err(|_| format!("{s:?} is not a CIDR: write it like 10.0.0.0/8 or 2001:db8::/32"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len: u32 = match len {
        Some(l) => l.parse().map_err(|_| format!("{s:?}: prefix length {l:?} is not a number"))?,
        None => max,
    };
    if len > max {
        return Err(format!("{s:?}: prefix length {len} is longer than {max}"));
    }
    let (bytes, prefix_len) = match ip {
        IpAddr::V4(v4) => (ipv4_mapped(v4.octets()), 96 + len),
        IpAddr::V6(v6) => (v6.octets(), len),
    };
    let masked = mask(bytes, prefix_len);
    if masked != bytes {
        let net = Cidr { prefix_len, addr: masked };
        return Err(format!("{s:?} has host bits set: did you mean {net}?"));
    }
    Ok(Cidr { prefix_len, addr: bytes })
}

fn mask(mut bytes: [u8; 16], prefix_len: u32) -> [u8; 16] {
    for (i, b) in bytes.iter_mut().enumerate() {
        let bits = (i64::from(prefix_len) - 8 * i as i64).clamp(0, 8) as u32;
        *b &= if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
    }
    bytes
}

/// A tier name.
pub(crate) fn parse_tier(s: &str) -> Result<u8, String> {
    let s = s.trim().to_ascii_lowercase();
    tier::NAMES
        .iter()
        .position(|n| *n == s)
        .map(|i| i as u8)
        .ok_or_else(|| format!("unknown tier {s:?}: use one of {}", tier::NAMES.join(", ")))
}

/// `CIDR=TIER`, as given to `attach --tier`.
pub(crate) fn parse_assignment(s: &str) -> Result<(Cidr, u8), String> {
    let (cidr, t) = s.split_once('=').ok_or_else(|| format!("{s:?} is not CIDR=TIER (e.g. 10.0.0.0/8=critical)"))?;
    Ok((parse_cidr(cidr)?, parse_tier(t)?))
}

/// `TIER=FRACTION` with the fraction in (0, 1], as given to `set --share`; returns permille.
pub(crate) fn parse_share(s: &str) -> Result<(u8, u16), String> {
    let (t, f) = s.split_once('=').ok_or_else(|| format!("{s:?} is not TIER=FRACTION (e.g. low=0.6)"))?;
    let t = parse_tier(t)?;
    if t == tier::EXEMPT {
        return Err("exempt has no share: exempt clients are always admitted".into());
    }
    let f: f64 = f.trim().parse().map_err(|_| format!("{f:?} is not a fraction: give a number in (0, 1], e.g. 0.6"))?;
    if !(f > 0.0 && f <= 1.0) {
        return Err(format!("share {f} of {} is outside (0, 1]", tier_name(t)));
    }
    Ok((t, (f * 1000.0).round().max(1.0) as u16))
}

/// `TIER=ACTION`, as given to `set --tier-action`.
pub(crate) fn parse_tier_action(s: &str) -> Result<(u8, Action), String> {
    let (t, a) = s.split_once('=').ok_or_else(|| format!("{s:?} is not TIER=ACTION (e.g. low=drop)"))?;
    let action = match a.trim() {
        "drop" => Action::Drop,
        "rst" => Action::Rst,
        "http" => Action::Http,
        other => return Err(format!("unknown action {other:?}: use drop, rst or http")),
    };
    Ok((parse_tier(t)?, action))
}

/// Merges assignments, refusing one CIDR given two different tiers.
pub(crate) fn merge(assignments: impl IntoIterator<Item = (Cidr, u8)>) -> Result<BTreeMap<Cidr, u8>, String> {
    let mut out = BTreeMap::new();
    for (cidr, t) in assignments {
        if let Some(&old) = out.get(&cidr)
            && old != t
        {
            return Err(format!("{cidr} is given twice, as {} and as {}: keep one", tier_name(old), tier_name(t)));
        }
        out.insert(cidr, t);
    }
    Ok(out)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TierFile {
    tiers: BTreeMap<String, String>,
}

/// Reads a tier file:
///
/// ```toml
/// [tiers]
/// "10.0.0.0/8" = "critical"
/// "2001:db8::/32" = "low"
/// ```
pub(crate) fn load_tier_file(path: &Path) -> Result<Vec<(Cidr, u8)>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read the tier file {}: {e}", path.display()))?;
    parse_tier_file(&text).map_err(|e| format!("tier file {}: {e}", path.display()))
}

pub(crate) fn parse_tier_file(text: &str) -> Result<Vec<(Cidr, u8)>, String> {
    let file: TierFile = toml::from_str(text).map_err(|e| e.to_string().trim().to_owned())?;
    file.tiers
        .iter()
        .map(|(cidr, t)| Ok((parse_cidr(cidr)?, parse_tier(t).map_err(|e| format!("{cidr}: {e}"))?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        let c = parse_cidr("10.0.0.0/8").unwrap();
        assert_eq!((c.prefix_len, c.to_string()), (104, "10.0.0.0/8".to_owned()));
        assert_eq!(parse_cidr("192.0.2.7").unwrap().to_string(), "192.0.2.7/32");
        assert_eq!(parse_cidr("2001:db8::/32").unwrap().to_string(), "2001:db8::/32");
        assert_eq!(parse_cidr("::/0").unwrap().prefix_len, 0);
        assert!(parse_cidr("10.0.0.1/8").unwrap_err().contains("did you mean 10.0.0.0/8"));
        assert!(parse_cidr("10.0.0.0/33").unwrap_err().contains("longer than 32"));
        assert!(parse_cidr("2001:db8::/129").is_err());
        assert!(parse_cidr("banana/8").unwrap_err().contains("not a CIDR"));
        // Masks that end inside a byte.
        assert!(parse_cidr("10.17.0.0/12").unwrap_err().contains("did you mean 10.16.0.0/12"));
        assert!(parse_cidr("10.16.0.0/12").is_ok());
        assert!(parse_cidr("10.0.0.0/8").unwrap().is_v4());
        assert!(!parse_cidr("2001:db8::/32").unwrap().is_v4());
        let short = Cidr { prefix_len: 64, addr: ipv4_mapped([10, 0, 0, 0]) };
        assert!(!short.is_v4(), "inside the mapped range but shorter than /96: not an IPv4 CIDR");
    }

    #[test]
    fn tiers_shares_actions() {
        assert_eq!(parse_tier("Critical"), Ok(tier::CRITICAL));
        assert_eq!((tier_name(tier::LOW), tier_name(tier::EXEMPT)), ("low", "exempt"));
        assert_eq!(tier_name(9), "normal", "an unknown tier reads as the default");
        assert!(parse_tier("gold").unwrap_err().contains("exempt, critical, normal, low"));
        assert_eq!(parse_assignment("10.0.0.0/8=low").unwrap().1, tier::LOW);
        assert!(parse_assignment("10.0.0.0/8").is_err());
        assert_eq!(parse_share("low=0.6"), Ok((tier::LOW, 600)));
        assert_eq!(parse_share("normal=1"), Ok((tier::NORMAL, 1000)));
        for bad in ["low=0", "low=1.5", "low=-0.1", "low=x", "exempt=0.5", "gold=0.5"] {
            assert!(parse_share(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_tier_action("low=drop"), Ok((tier::LOW, Action::Drop)));
        assert!(parse_tier_action("low=reset").is_err());
    }

    #[test]
    fn conflicting_duplicates_are_refused() {
        let a = parse_cidr("10.0.0.0/8").unwrap();
        let b = parse_cidr("10.1.0.0/16").unwrap();
        // Nested prefixes are fine: the longest wins.
        assert_eq!(merge([(a, tier::LOW), (b, tier::CRITICAL)]).unwrap().len(), 2);
        assert_eq!(merge([(a, tier::LOW), (a, tier::LOW)]).unwrap().len(), 1);
        assert!(merge([(a, tier::LOW), (a, tier::CRITICAL)]).unwrap_err().contains("given twice"));
    }

    #[test]
    fn tier_files() {
        let ok = parse_tier_file("[tiers]\n\"10.0.0.0/8\" = \"critical\"\n\"2001:db8::/32\" = \"low\"\n").unwrap();
        assert_eq!(ok.len(), 2);
        assert!(parse_tier_file("[tiers]\n\"10.0.0.0/8\" = \"gold\"\n").unwrap_err().contains("unknown tier"));
        assert!(parse_tier_file("[tier]\n").unwrap_err().contains("tier"));
        let err = parse_tier_file("[tiers]\n\"10.0.0.0/8\" = critical\n").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiers.toml");
        std::fs::write(&path, "[tiers]\n\"10.0.0.0/8\" = \"critical\"\n").unwrap();
        assert_eq!(load_tier_file(&path).unwrap(), vec![(parse_cidr("10.0.0.0/8").unwrap(), tier::CRITICAL)]);
        let missing = load_tier_file(&dir.path().join("nope.toml")).unwrap_err();
        assert!(missing.contains("nope.toml"), "the error names the file: {missing}");
    }
}
