// SPDX-License-Identifier: MIT OR Apache-2.0
//! `shedctl top`: a live terminal view of every protected port, read from
//! the pinned maps (the daemon does not take part). Per port: limit and
//! in-flight over time on one scale, shed rate by tier and by reason, and
//! latency percentiles (queue wait apart from service time).
use std::{collections::VecDeque, time::Duration};

use ratatui::{
    Frame,
    buffer::Buffer,
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Paragraph, Row, Sparkline, Table},
};
use shed_common::tier;

use crate::observe::stats::{PortStats, json_name};

/// Samples of history kept per port (wider terminals show more).
const HISTORY: usize = 512;

/// One port's history and its two latest samples.
#[derive(Debug)]
struct PortView {
    port: u16,
    netns: String,
    limits: VecDeque<u64>,
    in_flight: VecDeque<u64>,
    now: PortStats,
    /// Per-second rates since the previous sample.
    rates: Rates,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Rates {
    pub syn: f64,
    pub admitted: f64,
    pub shed: f64,
    /// limit, share, client (its cap or its share).
    pub by_reason: [f64; 3],
    /// Of the sheds, requests refused on kept-alive connections.
    pub requests_refused: f64,
    /// Admitted and shed per tier.
    pub tier_admitted: [f64; tier::COUNT],
    pub tier_shed: [f64; tier::COUNT],
}

impl Rates {
    fn between(before: &PortStats, now: &PortStats, elapsed: Duration) -> Self {
        let secs = elapsed.as_secs_f64();
        if secs <= 0.0 {
            return Self::default();
        }
        let per_sec = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
        let (r, rb) = (&now.rejected_by_reason, &before.rejected_by_reason);
        let tier = |t: usize, f: fn(&crate::observe::stats::TierStats) -> u64| {
            let name = tier::NAMES[t];
            per_sec(f(&now.tiers[name]), f(&before.tiers[name]))
        };
        Self {
            syn: per_sec(now.syn_seen, before.syn_seen),
            admitted: per_sec(now.admitted, before.admitted),
            shed: per_sec(now.rejected, before.rejected),
            by_reason: [
                per_sec(r.limit, rb.limit),
                per_sec(r.share, rb.share),
                per_sec(r.client_cap + r.client_share, rb.client_cap + rb.client_share),
            ],
            requests_refused: per_sec(now.refused_requests, before.refused_requests),
            tier_admitted: std::array::from_fn(|t| tier(t, |s| s.admitted)),
            tier_shed: std::array::from_fn(|t| tier(t, |s| s.rejected)),
        }
    }
}

/// What `top` shows; fed one sample of every port per refresh.
#[derive(Debug, Default)]
pub(crate) struct Top {
    ports: Vec<PortView>,
    pub interval: Duration,
}

impl Top {
    pub(crate) fn new(interval: Duration) -> Self {
        Self { ports: Vec::new(), interval }
    }

    /// Adds a sample of every port, taken `elapsed` after the previous one.
    pub(crate) fn update(&mut self, sample: Vec<PortStats>, elapsed: Duration) {
        self.ports.retain(|v| sample.iter().any(|s| s.port == v.port && s.netns == v.netns));
        for stats in sample {
            let view =
                if let Some(view) = self.ports.iter_mut().find(|v| v.port == stats.port && v.netns == stats.netns) {
                    view.rates = Rates::between(&view.now, &stats, elapsed);
                    view.now = stats;
                    view
                } else {
                    self.ports.push(PortView {
                        port: stats.port,
                        netns: stats.netns.clone(),
                        limits: VecDeque::new(),
                        in_flight: VecDeque::new(),
                        now: stats,
                        rates: Rates::default(),
                    });
                    self.ports.last_mut().expect("just pushed")
                };
            push_bounded(&mut view.limits, view.now.limit.into());
            push_bounded(&mut view.in_flight, view.now.in_flight);
        }
        self.ports.sort_by(|a, b| (&a.netns, a.port).cmp(&(&b.netns, b.port)));
    }

    /// Draws every port, stacked.
    pub(crate) fn draw(&self, frame: &mut Frame) {
        let area = frame.area();
        let [body, footer] = Layout::vertical([Constraint::Min(1), Constraint::Length(1)]).areas(area);
        if self.ports.is_empty() {
            frame
                .render_widget(Paragraph::new("no protected port: `shedctl attach --port PORT` starts the gate"), body);
        }
        let rows = Layout::vertical(self.ports.iter().map(|_| Constraint::Length(PORT_HEIGHT))).split(body);
        for (view, rect) in self.ports.iter().zip(rows.iter()) {
            draw_port(frame, *rect, view);
        }
        let help = format!(
            "q quits · every {} ms · limit (yellow) and in-flight (cyan) share one scale",
            self.interval.as_millis()
        );
        frame.render_widget(Paragraph::new(help).style(Style::new().add_modifier(Modifier::DIM)), footer);
    }
}

fn push_bounded(series: &mut VecDeque<u64>, value: u64) {
    if series.len() == HISTORY {
        series.pop_front();
    }
    series.push_back(value);
}

/// Rows one port takes.
const PORT_HEIGHT: u16 = 17;

fn draw_port(frame: &mut Frame, area: Rect, view: &PortView) {
    let s = &view.now;
    let decision = s.last_decision.map_or("-".to_owned(), |r| json_name(&r));
    let netns = match &s.pod {
        Some(pod) => format!("pod {pod} · "),
        None if s.netns == crate::host::paths::OWN_NETNS_LABEL => String::new(),
        None => format!("netns {} · ", s.netns),
    };
    let handing_over = s.state == crate::observe::stats::GateState::HandingOver;
    let title = format!(
        " {netns}port {} · {} ({decision}) · action {}{}{} ",
        s.port,
        s.algo,
        s.action,
        if s.dry_run { " · DRY-RUN" } else { "" },
        if handing_over { " · HANDING OVER (the last agent's programs judge it)" } else { "" }
    );
    let block = Block::default().borders(Borders::ALL).title(title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [summary, limit_row, flight_row, tables] =
        Layout::vertical([Constraint::Length(1), Constraint::Length(3), Constraint::Length(3), Constraint::Min(6)])
            .areas(inner);

    draw_summary(frame, summary, s, &view.rates);
    draw_history(frame, limit_row, flight_row, view);
    draw_tables(frame, tables, s, &view.rates);
}

/// The port's one-line summary: limit, in-flight and its parts, the rates.
fn draw_summary(frame: &mut Frame, summary: Rect, s: &PortStats, r: &Rates) {
    frame.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled(format!("limit {}", s.limit), Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD)),
            Span::raw("  "),
            Span::styled(
                format!("in-flight {}", s.in_flight),
                Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD),
            ),
            Span::raw(format!(
                "  (established {}, busy {}, pending {})  SYN {:.0}/s  admitted {:.0}/s  ",
                s.established, s.busy, s.pending, r.syn, r.admitted
            )),
            Span::styled(format!("shed {:.0}/s", r.shed), Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)),
            // Only when some are: the line must fit 110 columns.
            Span::raw(if r.requests_refused >= 0.5 {
                format!(" ({:.0}/s kept-alive)", r.requests_refused)
            } else {
                String::new()
            }),
        ])),
        summary,
    );
}

/// The limit and in-flight over the last windows, on one scale.
fn draw_history(frame: &mut Frame, limit_row: Rect, flight_row: Rect, view: &PortView) {
    // One scale for both, so in-flight touching the limit looks like it.
    let width = usize::from(limit_row.width.saturating_sub(12));
    let tail = |v: &VecDeque<u64>| -> Vec<u64> { v.iter().skip(v.len().saturating_sub(width)).copied().collect() };
    let scale = view.limits.iter().chain(&view.in_flight).copied().max().unwrap_or(1).max(1);
    for (row, name, series, color) in
        [(limit_row, "limit", &view.limits, Color::Yellow), (flight_row, "in-flight", &view.in_flight, Color::Cyan)]
    {
        let [label, spark] = Layout::horizontal([Constraint::Length(12), Constraint::Min(1)]).areas(row);
        frame.render_widget(Paragraph::new(format!("{name}\n0..{scale}")), label);
        frame.render_widget(Sparkline::default().data(tail(series)).max(scale).style(Style::new().fg(color)), spark);
    }
}

/// The rates by tier and reason, and the last window's latencies.
fn draw_tables(frame: &mut Frame, tables: Rect, s: &PortStats, r: &Rates) {
    let [by_tier, latency] = Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(tables);
    let mut tier_rows: Vec<Row> = (0..tier::COUNT)
        .map(|t| {
            let ts = &s.tiers[tier::NAMES[t]];
            Row::new(vec![
                tier::NAMES[t].to_owned(),
                format!("{:.0}", r.tier_admitted[t]),
                format!("{:.0}", r.tier_shed[t]),
                format!("{:.2}", ts.share),
                ts.held_back.to_string(),
            ])
        })
        .collect();
    tier_rows.push(Row::new(vec![
        "by reason".to_owned(),
        format!("limit {:.0}/s", r.by_reason[0]),
        format!("share {:.0}/s", r.by_reason[1]),
        format!("client cap {:.0}/s", r.by_reason[2]),
    ]));
    frame.render_widget(
        Table::new(
            tier_rows,
            [
                Constraint::Length(10),
                Constraint::Length(11),
                Constraint::Length(11),
                Constraint::Length(14),
                Constraint::Length(5),
            ],
        )
        .header(
            Row::new(["tier", "admitted/s", "shed/s", "share", "held"])
                .style(Style::new().add_modifier(Modifier::BOLD)),
        )
        .block(Block::default().borders(Borders::TOP).title(" shed by tier and reason ")),
        by_tier,
    );
    let ms = |us: u64| format!("{:.1} ms", us as f64 / 1000.0);
    let latency_rows = vec![
        Row::new(vec!["queue wait".to_owned(), ms(s.queue_wait_p50_us), ms(s.queue_wait_p99_us)]),
        Row::new(vec!["service".to_owned(), ms(s.service_p50_us), ms(s.service_p99_us)]),
        Row::new(vec!["sojourn".to_owned(), ms(s.sojourn_p50_us), ms(s.sojourn_p99_us)]),
        Row::new(vec![format!("p{} now", s.percentile), ms(s.observed_us), format!("baseline {}", ms(s.baseline_us))]),
        Row::new(vec![
            "accept q".to_owned(),
            format!("{}/{}", s.accept_queue, s.accept_backlog),
            format!("{} listen drops", s.listen_drops),
        ]),
    ];
    frame.render_widget(
        Table::new(latency_rows, [Constraint::Length(11), Constraint::Length(10), Constraint::Min(10)])
            .header(Row::new(["latency", "p50", "p99"]).style(Style::new().add_modifier(Modifier::BOLD)))
            .block(Block::default().borders(Borders::TOP).title(" last window ")),
        latency,
    );
}

/// The screen as plain text, one line per row, trailing spaces trimmed.
pub(crate) fn screen_text(buffer: &Buffer) -> String {
    let area = buffer.area;
    let mut out = String::new();
    for y in area.top()..area.bottom() {
        let line: String = (area.left()..area.right()).map(|x| buffer[(x, y)].symbol()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Renders one frame of `top` into a `width` x `height` text screen.
pub(crate) fn render_text(top: &Top, width: u16, height: u16) -> String {
    let mut terminal =
        ratatui::Terminal::new(ratatui::backend::TestBackend::new(width, height)).expect("a test backend never fails");
    terminal.draw(|f| top.draw(f)).expect("a test backend never fails");
    screen_text(terminal.backend().buffer())
}

#[cfg(test)]
mod tests {
    use super::*;

    use shed_common::{
        ControlConfig, ControlStatus, PortConfig, PortCounters, PortState, TierReserve, UserPortState, action,
        count_mode,
    };

    fn stats(limit: u32, in_flight: u64, admitted: u64, shed_low: u64) -> PortStats {
        let empty = crate::kernel::maps::PortSnapshot {
            port: 8080,
            config: PortConfig { tiered: 1, ..PortConfig::new(0, action::RST, false, count_mode::WORK) },
            limit: 0,
            control: ControlConfig::default(),
            status: ControlStatus::default(),
            reserve: TierReserve::default(),
            state: PortState::default(),
            user: UserPortState::default(),
            ring: shed_common::HandshakeRing::default(),
            silent: shed_common::HandshakeRing::default(),
            now_ns: 0,
            counters: PortCounters::default(),
        };
        let mut s = PortStats::new(&empty, None);
        s.limit = limit;
        s.in_flight = in_flight;
        s.admitted = admitted;
        s.rejected = shed_low;
        s.rejected_by_reason.share = shed_low;
        s.tiers.get_mut("low").unwrap().rejected = shed_low;
        s.tiers.get_mut("normal").unwrap().admitted = admitted;
        s.sojourn_p99_us = 48_000;
        s.queue_wait_p99_us = 31_000;
        s.accept_queue = 7;
        s.accept_backlog = 128;
        s
    }

    #[test]
    fn renders_limit_in_flight_shed_rates_and_latency() {
        let mut top = Top::new(Duration::from_millis(100));
        top.update(vec![stats(20, 5, 100, 0)], Duration::from_secs(1));
        for i in 1..=30 {
            top.update(vec![stats(20, 5 + i % 16, 100 + 50 * i, 25 * i)], Duration::from_secs(1));
        }
        let text = render_text(&top, 110, 20);
        for expected in [
            "port 8080",
            "limit 20",
            "in-flight 19",
            "admitted 50/s",
            "shed 25/s",
            "low",
            "share 25/s",
            "sojourn",
            "48.0 ms",
            "queue wait",
            "31.0 ms",
            "accept q",
            "7/128",
        ] {
            assert!(text.contains(expected), "{expected:?} not on screen:\n{text}");
        }
        // The sparklines drew bars.
        assert!(text.chars().any(|c| "▁▂▃▄▅▆▇█".contains(c)), "no sparkline:\n{text}");
    }

    #[test]
    fn a_port_handed_over_says_so_in_its_title() {
        let mut top = Top::new(Duration::from_millis(100));
        let mut s = stats(20, 5, 100, 0);
        top.update(vec![s.clone()], Duration::from_secs(1));
        assert!(!render_text(&top, 140, 20).contains("HANDING OVER"));
        s.state = crate::observe::stats::GateState::HandingOver;
        top.update(vec![s], Duration::from_secs(1));
        let text = render_text(&top, 140, 20);
        assert!(text.contains("port 8080") && text.contains("HANDING OVER"), "{text}");
    }

    #[test]
    fn says_so_when_nothing_is_protected() {
        let text = render_text(&Top::new(Duration::from_millis(500)), 80, 5);
        assert!(text.contains("no protected port"), "{text}");
    }
}
