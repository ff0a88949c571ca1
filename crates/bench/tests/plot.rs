//! The bench charts: valid PNGs of the promised size, with their text
//! (title, legend, axis labels) actually rendered by the embedded font and
//! their data actually drawn; degenerate input (no series, empty series,
//! one point, NaN) draws an empty chart instead of panicking.

use std::path::{Path, PathBuf};

use pagesift_bench::plot::{CHART_SIZE, LEGEND_WIDTH, line_chart, scatter_chart};
use pagesift_bench::series::Series;

/// A scratch directory of this test process, removed on drop.
struct Scratch(tempfile::TempDir);

impl Scratch {
    fn new(name: &str) -> Scratch {
        Scratch(pagesift_testkit::temp_dir(&format!("plot-{name}")))
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

/// A decoded RGB image.
struct Image {
    width: u32,
    height: u32,
    rgb: Vec<u8>,
}

impl Image {
    fn read(path: &Path) -> Image {
        let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut reader = png::Decoder::new(std::io::BufReader::new(file))
            .read_info()
            .expect("a valid PNG header");
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).expect("valid PNG data");
        assert_eq!(info.color_type, png::ColorType::Rgb);
        assert_eq!(info.bit_depth, png::BitDepth::Eight);
        buf.truncate(info.buffer_size());
        Image {
            width: info.width,
            height: info.height,
            rgb: buf,
        }
    }

    fn pixel(&self, x: u32, y: u32) -> (u8, u8, u8) {
        let i = 3 * (y * self.width + x) as usize;
        (self.rgb[i], self.rgb[i + 1], self.rgb[i + 2])
    }

    /// Pixels in the rectangle [x0, x1) × [y0, y1) that satisfy `f`.
    fn count(
        &self,
        (x0, x1): (u32, u32),
        (y0, y1): (u32, u32),
        f: impl Fn((u8, u8, u8)) -> bool,
    ) -> usize {
        let mut n = 0;
        for y in y0..y1.min(self.height) {
            for x in x0..x1.min(self.width) {
                n += f(self.pixel(x, y)) as usize;
            }
        }
        n
    }
}

/// Near-black: text is drawn in black (anti-aliased edges are grey).
fn dark(p: (u8, u8, u8)) -> bool {
    p.0 < 90 && p.1 < 90 && p.2 < 90
}

fn near(p: (u8, u8, u8), c: (u8, u8, u8)) -> bool {
    p.0.abs_diff(c.0) < 12 && p.1.abs_diff(c.1) < 12 && p.2.abs_diff(c.2) < 12
}

/// The first two legend colours (Tableau blue and orange).
const BLUE: (u8, u8, u8) = (31, 119, 180);
const ORANGE: (u8, u8, u8) = (255, 127, 14);

fn legend_panel() -> (u32, u32) {
    (CHART_SIZE.0 - LEGEND_WIDTH, CHART_SIZE.0)
}

fn plot_panel() -> (u32, u32) {
    // Right of the y-axis labels, left of the legend.
    (100, CHART_SIZE.0 - LEGEND_WIDTH)
}

fn ramp(system: &str, slope: f64) -> Series {
    let mut s = Series::new(system, "saved_mib", "MiB");
    for i in 0..240 {
        let t = i as f64 * 0.5;
        s.push(t, slope * t);
    }
    s
}

#[test]
fn line_chart_is_a_png_of_the_promised_size_with_title_legend_and_lines() {
    let dir = Scratch::new("line");
    let (a, b) = (ramp("pagesift-full", 20.0), ramp("ksm-1000", 8.0));
    let path = dir.file("saved.png");
    line_chart(
        &path,
        "static-mixed: memory saved",
        "time (s)",
        "saved (MiB)",
        &[&a, &b],
    )
    .unwrap();
    let img = Image::read(&path);
    assert_eq!((img.width, img.height), CHART_SIZE);

    // Legend: both colour swatches and black text in the legend panel.
    let legend_y = (40, 200);
    assert!(img.count(legend_panel(), legend_y, |p| near(p, BLUE)) > 30);
    assert!(img.count(legend_panel(), legend_y, |p| near(p, ORANGE)) > 30);
    let text = img.count(legend_panel(), legend_y, dark);
    assert!(text > 100, "legend text pixels: {text}");

    // Title: black text in the top band above the plot.
    let title = img.count((0, CHART_SIZE.0), (0, 36), dark);
    assert!(title > 200, "title pixels: {title}");

    // Axis descriptions and tick labels left of and below the plot.
    assert!(img.count((0, 90), (40, CHART_SIZE.1 - 60), dark) > 200);
    assert!(img.count(plot_panel(), (CHART_SIZE.1 - 60, CHART_SIZE.1), dark) > 200);

    // Both lines are drawn inside the plot.
    let plot_y = (40, CHART_SIZE.1 - 60);
    assert!(img.count(plot_panel(), plot_y, |p| near(p, BLUE)) > 500);
    assert!(img.count(plot_panel(), plot_y, |p| near(p, ORANGE)) > 500);
}

#[test]
fn a_chart_with_data_differs_from_one_without() {
    let dir = Scratch::new("differs");
    let a = ramp("pagesift-low", 3.0);
    let (with, without) = (dir.file("with.png"), dir.file("without.png"));
    line_chart(&with, "cpu", "time (s)", "CPU (% of a core)", &[&a]).unwrap();
    line_chart(&without, "cpu", "time (s)", "CPU (% of a core)", &[]).unwrap();
    let (w, wo) = (Image::read(&with), Image::read(&without));
    assert_eq!((wo.width, wo.height), CHART_SIZE);
    // No series: the legend panel is blank and no series colour appears.
    assert_eq!(
        wo.count(legend_panel(), (0, CHART_SIZE.1), |p| p != (255, 255, 255)),
        0
    );
    assert_eq!(
        wo.count((0, CHART_SIZE.0), (0, CHART_SIZE.1), |p| near(p, BLUE)),
        0
    );
    // "no data" is written in grey on the empty plot.
    assert!(
        wo.count(plot_panel(), (40, CHART_SIZE.1 - 60), |p| p.0 == p.1
            && p.1 == p.2
            && p.0 < 180)
            > 50
    );
    let differing = w
        .rgb
        .chunks(3)
        .zip(wo.rgb.chunks(3))
        .filter(|(x, y)| x != y)
        .count();
    assert!(differing > 1000, "only {differing} pixels differ");
}

#[test]
fn empty_series_single_points_and_nan_do_not_panic() {
    let dir = Scratch::new("degenerate");
    let empty = Series::new("ksmtuned", "saved_mib", "MiB");
    let mut one = Series::new("ksm-100", "saved_mib", "MiB");
    one.push(3.0, 42.0);
    let mut nan = Series::new("ksm-advisor", "saved_mib", "MiB");
    nan.push(0.0, f64::NAN);
    nan.push(1.0, f64::INFINITY);

    let path = dir.file("degenerate.png");
    line_chart(&path, "degenerate", "t", "v", &[&empty, &one, &nan]).unwrap();
    let img = Image::read(&path);
    assert_eq!((img.width, img.height), CHART_SIZE);
    // The single point is drawn as a dot in its colour (the second one).
    assert!(img.count(plot_panel(), (40, CHART_SIZE.1 - 60), |p| near(p, ORANGE)) > 20);

    let path = dir.file("only-empty.png");
    line_chart(&path, "only empty", "t", "v", &[&empty]).unwrap();
    assert_eq!(Image::read(&path).width, CHART_SIZE.0);

    let path = dir.file("scatter-empty.png");
    scatter_chart(&path, "nothing", "CPU (s)", "saved (MiB)", &[]).unwrap();
    assert_eq!(Image::read(&path).height, CHART_SIZE.1);

    let path = dir.file("scatter-one.png");
    scatter_chart(
        &path,
        "one",
        "CPU (s)",
        "saved (MiB)",
        &[("ksmtuned".into(), 0.0, 0.0)],
    )
    .unwrap();
    let img = Image::read(&path);
    assert!(img.count((0, CHART_SIZE.0), (0, CHART_SIZE.1), |p| near(p, BLUE)) > 20);
}

#[test]
fn scatter_chart_draws_each_point_with_its_label() {
    let dir = Scratch::new("scatter");
    let points = vec![
        ("pagesift-full".to_string(), 12.0, 3000.0),
        ("ksm-100".to_string(), 40.0, 2500.0),
        ("ksm-10000".to_string(), 95.0, 3100.0),
    ];
    let path = dir.file("saving-vs-cpu.png");
    scatter_chart(&path, "saving vs CPU", "CPU (s)", "saved (MiB)", &points).unwrap();
    let img = Image::read(&path);
    assert_eq!((img.width, img.height), CHART_SIZE);
    let plot_y = (40, CHART_SIZE.1 - 60);
    // Each point's dot, in its own colour, inside the plot.
    assert!(img.count(plot_panel(), plot_y, |p| near(p, BLUE)) > 50);
    assert!(img.count(plot_panel(), plot_y, |p| near(p, ORANGE)) > 50);
    assert!(img.count(plot_panel(), plot_y, |p| near(p, (44, 160, 44))) > 50);
    // The legend lists the three systems.
    assert!(img.count(legend_panel(), (40, 200), dark) > 150);

    // Labels next to the points: the same chart without labels would have
    // no dark pixels right of a point; compare with a chart of one system.
    let alone = dir.file("alone.png");
    scatter_chart(
        &alone,
        "saving vs CPU",
        "CPU (s)",
        "saved (MiB)",
        &points[..1],
    )
    .unwrap();
    let alone = Image::read(&alone);
    let dark_plot = |i: &Image| i.count((110, CHART_SIZE.0 - LEGEND_WIDTH - 20), plot_y, dark);
    assert!(
        dark_plot(&img) > dark_plot(&alone) + 100,
        "point labels drawn"
    );
}

#[test]
fn an_unwritable_path_is_an_error_naming_the_file() {
    let path = Path::new("/proc/pagesift-no-such-dir/chart.png");
    let s = ramp("pagesift-full", 1.0);
    let err = line_chart(path, "t", "x", "y", &[&s]).unwrap_err();
    assert_eq!(err.path, path);
    assert!(
        err.to_string()
            .contains("/proc/pagesift-no-such-dir/chart.png"),
        "{err}"
    );
    let err = scatter_chart(path, "t", "x", "y", &[("a".into(), 1.0, 1.0)]).unwrap_err();
    assert!(err.to_string().contains("chart.png"), "{err}");
}

/// Writes the example charts to $PAGESIFT_PLOT_EXAMPLES for a person to
/// look at (ignored by default).
#[test]
#[ignore]
fn write_examples() {
    let dir = PathBuf::from(
        std::env::var("PAGESIFT_PLOT_EXAMPLES").unwrap_or("/tmp/pagesift-plots".into()),
    );
    let mut a = Series::new("pagesift-full", "saved_mib", "MiB");
    let mut b = Series::new("ksm-1000", "saved_mib", "MiB");
    let mut c = Series::new("ksmtuned", "saved_mib", "MiB");
    for i in 0..240 {
        let t = i as f64 * 0.5;
        a.push(t, 3000.0 * (1.0 - (-t / 10.0).exp()));
        b.push(t, (t * 30.0).min(2800.0));
        c.push(
            t,
            if t < 60.0 {
                0.0
            } else {
                ((t - 60.0) * 20.0).min(2500.0)
            },
        );
    }
    line_chart(
        &dir.join("saved.png"),
        "static-mixed: memory saved",
        "time (s)",
        "saved (MiB)",
        &[&a, &b, &c],
    )
    .unwrap();
    scatter_chart(
        &dir.join("scatter.png"),
        "static-mixed: saving vs CPU",
        "CPU until merged (s)",
        "saved (MiB)",
        &[
            ("pagesift-full".into(), 5.0, 3000.0),
            ("ksm-1000".into(), 40.0, 2800.0),
            ("ksmtuned".into(), 20.0, 2500.0),
        ],
    )
    .unwrap();
}
