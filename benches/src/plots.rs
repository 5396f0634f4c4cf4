//! SVG bar charts: memory-bound ops as % of the copy bandwidth, and GEMM TFLOP/s of Calico,
//! cuBLASLt and torch. Horizontal bars, so the case names read as plain labels.

use crate::report::Report;
use plotters::prelude::*;

/// One group of bars: a case name and one optional value per series.
struct Group {
    label: String,
    values: Vec<Option<f64>>,
    /// A target drawn as a short vertical mark across the group.
    target: Option<f64>,
}

const SERIES_COLOURS: [RGBColor; 3] = [
    RGBColor(230, 120, 30),
    RGBColor(60, 110, 200),
    RGBColor(120, 120, 120),
];

/// The plots of `report`: (file name, SVG text).
pub fn render(report: &Report) -> Vec<(String, String)> {
    let copy = report.copy.as_ref().and_then(|c| c.gbps);
    let memory: Vec<Group> = report
        .memory
        .iter()
        .map(|m| Group {
            label: m.name.clone(),
            values: vec![
                m.pct_of_copy,
                match (m.torch_gbps, copy) {
                    (Some(t), Some(c)) if c > 0.0 => Some(100.0 * t / c),
                    _ => None,
                },
            ],
            target: Some(m.target_pct),
        })
        .collect();
    let gemm: Vec<Group> = report
        .gemm
        .iter()
        .map(|g| Group {
            label: g.name.trim_start_matches("gemm ").to_string(),
            values: vec![g.calico_tflops, g.cublaslt_tflops, g.torch_tflops],
            target: None,
        })
        .collect();
    let title = &report.device.name;
    vec![
        (
            "memory.svg".to_string(),
            svg_or_error(|| {
                bar_chart(
                    &format!("Memory-bound ops, % of copy bandwidth ({title})"),
                    "% of copy bandwidth (target marked)",
                    &["Calico", "torch"],
                    &memory,
                )
            }),
        ),
        (
            "gemm.svg".to_string(),
            svg_or_error(|| {
                bar_chart(
                    &format!("bf16 GEMM TFLOP/s ({title})"),
                    "TFLOP/s",
                    &["Calico", "cuBLASLt", "torch"],
                    &gemm,
                )
            }),
        ),
    ]
}

fn svg_or_error(draw: impl FnOnce() -> Result<String, String>) -> String {
    draw().unwrap_or_else(|e| {
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\" height=\"40\"><text x=\"5\" y=\"20\">plot failed: {}</text></svg>",
            e.replace('&', "&amp;").replace('<', "&lt;")
        )
    })
}

fn bar_chart(
    title: &str,
    x_desc: &str,
    series: &[&str],
    groups: &[Group],
) -> Result<String, String> {
    let slots = series.len() as i32 + 1;
    let rows = (groups.len().max(1) as i32) * slots;
    let max = groups
        .iter()
        .flat_map(|g| g.values.iter().flatten().copied().chain(g.target))
        .fold(0.0f64, f64::max);
    // Headroom on the right for the legend.
    let x_max = if max > 0.0 { max * 1.3 } else { 1.0 };
    let height = 120 + 14 * rows as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(260)
            .build_cartesian_2d(0.0..x_max, (0..rows - 1).into_segmented())
            .map_err(|e| e.to_string())?;
        // Row 0 is at the bottom; the first group goes at the top.
        let row = |group: usize, series: usize| rows - 1 - (group as i32 * slots + series as i32);
        let label_at = |v: &SegmentValue<i32>| -> String {
            let i = match v {
                SegmentValue::Exact(i) | SegmentValue::CenterOf(i) => *i,
                SegmentValue::Last => return String::new(),
            };
            // Name each group on its first bar's row.
            let from_top = rows - 1 - i;
            if from_top % slots == 0 {
                groups
                    .get((from_top / slots) as usize)
                    .map_or_else(String::new, |g| g.label.clone())
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(rows as usize + 1)
            .y_label_formatter(&label_at)
            .x_desc(x_desc)
            .draw()
            .map_err(|e| e.to_string())?;
        for (s, name) in series.iter().enumerate() {
            let colour = SERIES_COLOURS[s % SERIES_COLOURS.len()];
            let bars = groups.iter().enumerate().filter_map(move |(gi, g)| {
                let v = g.values.get(s).copied().flatten()?;
                let row = row(gi, s);
                Some(Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(row)),
                        (v, SegmentValue::Exact(row + 1)),
                    ],
                    colour.filled(),
                ))
            });
            chart
                .draw_series(bars)
                .map_err(|e| e.to_string())?
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled())
                });
        }
        // The value at the end of each bar.
        let values = groups.iter().enumerate().flat_map(|(gi, g)| {
            g.values.iter().enumerate().filter_map(move |(s, v)| {
                let v = (*v)?;
                let text = if v >= 10.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.2}")
                };
                Some(
                    EmptyElement::at((v, SegmentValue::CenterOf(row(gi, s))))
                        + Text::new(text, (4, -5), ("sans-serif", 10).into_font()),
                )
            })
        });
        chart.draw_series(values).map_err(|e| e.to_string())?;
        let targets = groups.iter().enumerate().filter_map(|(gi, g)| {
            let t = g.target?;
            Some(PathElement::new(
                vec![
                    (t, SegmentValue::Exact(row(gi, series.len() - 1))),
                    (t, SegmentValue::Exact(row(gi, 0) + 1)),
                ],
                BLACK.stroke_width(2),
            ))
        });
        chart.draw_series(targets).map_err(|e| e.to_string())?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_report_still_plots() {
        let mut r = crate::report::tests::fake_report();
        r.memory.clear();
        r.gemm.clear();
        for (name, svg) in render(&r) {
            assert!(svg.starts_with("<svg"), "{name}: {svg}");
        }
    }

    #[test]
    fn bars_for_each_value() {
        let r = crate::report::tests::fake_report();
        let plots = render(&r);
        let mem = &plots[0].1;
        assert!(mem.contains("rms_norm bf16 65536x4096"), "{mem}");
        assert!(mem.contains("<rect"));
    }
}
