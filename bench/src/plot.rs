// SPDX-License-Identifier: MIT OR Apache-2.0
//! PNG plots for the benchmark report (plotters, bitmap backend; text drawn
//! with DejaVu Sans from Debian's fonts-dejavu-core, read at run time).
use std::{path::Path, sync::Once};

use anyhow::{Result, anyhow};
use plotters::prelude::*;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

const PALETTE: [RGBColor; 8] = [
    RGBColor(120, 120, 120),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
];

fn font() -> Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = std::fs::read(FONT)
            .map_err(|e| anyhow!("{FONT}: {e} (cargo xtask setup installs fonts-dejavu-core)"))
            .and_then(|bytes| {
                plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
                    .map_err(|_| anyhow!("{FONT} is not a usable font"))
            });
    });
    result
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("plot: {e}")
}

/// The series' names in a framed box.
fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
    font_size: u32,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", font_size))
        .draw()
        .map_err(err)
}

/// One line of a chart: name and (x, median, min, max) points.
pub(crate) struct Series {
    pub name: String,
    pub points: Vec<(f64, f64, f64, f64)>,
}

/// Goodput (fraction of capacity, in percent) against offered load, one line per configuration.
pub(crate) fn goodput_vs_load(path: &Path, title: &str, series: &[Series]) -> Result<()> {
    goodput_vs(path, title, ("offered load (x capacity)", "goodput (% of capacity)"), series)
}

/// Goodput (percent) against whatever the x axis names, one line per configuration.
pub(crate) fn goodput_vs(path: &Path, title: &str, descs: (&str, &str), series: &[Series]) -> Result<()> {
    lines(path, title, descs, series, 110.0)
}

/// Any figure against whatever the x axis names, from 0 to a little above the largest.
pub(crate) fn values_vs(path: &Path, title: &str, descs: (&str, &str), series: &[Series]) -> Result<()> {
    let max_y = series.iter().flat_map(|s| s.points.iter().map(|p| p.3.max(p.1))).fold(1.0, f64::max);
    lines(path, title, descs, series, max_y * 1.15)
}

fn lines(path: &Path, title: &str, (x_desc, y_desc): (&str, &str), series: &[Series], max_y: f64) -> Result<()> {
    font()?;
    let root = BitMapBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let max_x = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x * 1.05, 0.0..max_y)
        .map_err(err)?;
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).label_style(("sans-serif", 15)).draw().map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().map(|p| (p.0, p.1)), color.stroke_width(2)))
            .map_err(err)?
            .label(&s.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(s.points.iter().map(|p| Circle::new((p.0, p.1), 4, color.filled()))).map_err(err)?;
        // Min-max of the repeats.
        chart
            .draw_series(s.points.iter().map(|p| PathElement::new(vec![(p.0, p.2), (p.0, p.3)], color.stroke_width(1))))
            .map_err(err)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerLeft, 15)?;
    root.present().map_err(err)?;
    Ok(())
}

/// One 100 ms bin of a timeline.
pub(crate) struct TimelinePoint {
    pub t: f64,
    pub limit: f64,
    pub in_flight: f64,
    pub goodput: f64,
    pub capacity: f64,
    pub offered: f64,
    pub p99_ms: f64,
}

/// Limit / goodput / p99 over time, three panels, with vertical event markers.
pub(crate) fn timeline(path: &Path, title: &str, points: &[TimelinePoint], events: &[(f64, &str)]) -> Result<()> {
    font()?;
    let root = BitMapBackend::new(path, (1100, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (top, rest) = root.split_vertically(60);
    top.titled(title, ("sans-serif", 22)).map_err(err)?;
    let panels = rest.split_evenly((3, 1));
    let t_max = points.last().map_or(1.0, |p| p.t);
    type Pick = fn(&TimelinePoint) -> f64;
    type Panel<'a> = (&'a str, Vec<(&'a str, Pick, RGBColor)>);
    let specs: [Panel; 3] = [
        ("connections", vec![("limit", |p| p.limit, PALETTE[1]), ("in-flight", |p| p.in_flight, PALETTE[4])]),
        (
            "req/s",
            vec![
                ("offered", |p| p.offered, PALETTE[0]),
                ("capacity", |p| p.capacity, PALETTE[2]),
                ("goodput (answered in 1 s)", |p| p.goodput, PALETTE[5]),
            ],
        ),
        ("p99 ms (answered, per 100 ms)", vec![("p99", |p| p.p99_ms, PALETTE[3])]),
    ];
    for (area, (y_desc, lines)) in panels.iter().zip(specs) {
        let y_max = lines.iter().flat_map(|(_, f, _)| points.iter().map(f)).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..t_max, 0.0..y_max)
            .map_err(err)?;
        chart.configure_mesh().x_desc("seconds").y_desc(y_desc).label_style(("sans-serif", 14)).draw().map_err(err)?;
        for (t, _) in events {
            chart
                .draw_series(std::iter::once(PathElement::new(vec![(*t, 0.0), (*t, y_max)], BLACK.mix(0.4))))
                .map_err(err)?;
        }
        for (name, pick, color) in lines {
            chart
                .draw_series(LineSeries::new(points.iter().map(|p| (p.t, pick(p))), color.stroke_width(2)))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight, 13)?;
    }
    // Event names along the top.
    for (t, name) in events {
        let x = 72 + ((*t / t_max) * (1100.0 - 84.0)) as i32;
        top.draw(&Text::new(name.to_string(), (x, 40), ("sans-serif", 13))).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
