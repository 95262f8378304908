//! `shedctl set`: change a protected port's settings live.
use crate::{
    cli::SetArgs,
    daemon,
    maps::GateMaps,
    system::{self, Need},
};

pub fn execute(args: SetArgs) -> anyhow::Result<()> {
    system::check_privileges(Need::Maps)?;
    daemon::require_running()?;
    let mut maps = GateMaps::open_pinned()?;
    let mut config = maps.config(args.port)?;
    if let Some(limit) = args.limit {
        config.limit = limit;
    }
    if let Some(action) = args.action {
        config.action = action.to_raw();
    }
    if let Some(dry_run) = args.dry_run {
        config.dry_run = u8::from(dry_run.0);
    }
    // One map write: the kernel sees the old or the new config, never a mix.
    maps.write_config(args.port, config)?;
    println!(
        "port {}: limit {}, action {}, dry-run {}",
        args.port,
        config.limit,
        crate::input::Action::from_raw(config.action),
        if config.dry_run != 0 { "on" } else { "off" }
    );
    Ok(())
}
