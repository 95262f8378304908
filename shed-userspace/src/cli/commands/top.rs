// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl top`: the live view over the pinned maps.
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::{
    cli::TopArgs,
    host::system::{self, Need, TerminalInput},
    observe::stats::PortStats,
    observe::top::{Top, render_text},
};

pub fn execute(args: TopArgs) -> anyhow::Result<()> {
    system::check_privileges(Need::Maps)?;
    let gates = super::stats::judging(crate::cli::chosen_netns(args.netns.clone(), args.pod.as_deref())?.as_deref())?;
    let gates = match args.port {
        Some(port) => crate::kernel::maps::protecting(gates, port)?,
        None => gates,
    };
    let sample = || -> anyhow::Result<Vec<PortStats>> {
        let mut stats = Vec::new();
        for gate in &gates {
            for snapshot in gate.maps.snapshots(args.port)? {
                let mut s = PortStats::new(&snapshot, None);
                s.netns.clone_from(&gate.netns);
                s.pod.clone_from(&gate.pod);
                s.state = super::stats::state_of(gate);
                stats.push(s);
            }
        }
        Ok(stats)
    };
    let first = sample()?;
    if let Some(port) = args.port
        && first.is_empty()
    {
        anyhow::bail!("port {port} is not protected: `shedctl stats` lists the protected ports");
    }
    // Refresh once per control window: the limit cannot change faster.
    let window = first.iter().map(|s| s.window).min().unwrap_or(500);
    let interval = args.interval.unwrap_or(Duration::from_millis(u64::from(window).max(100)));
    let mut top = Top::new(interval);
    top.update(first, Duration::ZERO);
    let mut taken = Instant::now();

    if args.once {
        for _ in 1..args.samples {
            std::thread::sleep(interval);
            top.update(sample()?, taken.elapsed());
            taken = Instant::now();
        }
        print!("{}", render_text(&top, args.size.0, args.size.1));
        return Ok(());
    }

    // The view ends with its terminal even where no SIGHUP comes (see
    // TerminalWatch): the hang-up is watched for with the keys.
    let watch = system::TerminalWatch::open()
        .context("opening the terminal (shedctl top needs a terminal; --once prints one frame)")?;
    let mut terminal =
        ratatui::try_init().context("starting the terminal (shedctl top needs a terminal; --once prints one frame)")?;
    let result = (|| -> anyhow::Result<()> {
        loop {
            terminal.draw(|f| top.draw(f))?;
            let deadline = taken + interval;
            while let Some(wait) = deadline.checked_duration_since(Instant::now()) {
                match watch.wait(wait)? {
                    TerminalInput::HungUp => return Ok(()),
                    TerminalInput::Quiet => {}
                    // crossterm reads what is there at once and queues it:
                    // every queued key is looked at before the next wait.
                    TerminalInput::Ready => {
                        while event::poll(Duration::ZERO)? {
                            if let Event::Key(key) = event::read()?
                                && key.kind == KeyEventKind::Press
                                && (matches!(key.code, KeyCode::Char('q') | KeyCode::Esc)
                                    || (key.code == KeyCode::Char('c')
                                        && key.modifiers.contains(KeyModifiers::CONTROL)))
                            {
                                return Ok(());
                            }
                        }
                    }
                }
            }
            if !super::stats::still_judging() {
                anyhow::bail!("the gate stopped");
            }
            top.update(sample()?, taken.elapsed());
            taken = Instant::now();
        }
    })();
    ratatui::restore();
    result
}
