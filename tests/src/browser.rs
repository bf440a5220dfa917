//! What a reader's browser shows of commtap's HTML report: headless Chromium (Debian's
//! `chromium`, installed by `cargo xtask setup`) loads the page with no network to reach,
//! dumps its DOM, logs every request it made and takes a screenshot, which stays under
//! `target/html-report/` as the run's artifact. `tests/consumers/html_page.py` reads the
//! DOM and the logs back; the screenshot is decoded here.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::{repo_root, ChildGuard, Scratch};

const CHROMIUM: &str = "/usr/bin/chromium";
const LIMIT: Duration = Duration::from_mins(2);

/// The page as Chromium saw it (see `tests/consumers/html_page.py` for the fields):
/// `figures` by id (`caption`, `fills` per colour, `circles`, `texts`, `legend`,
/// `svg`), `sections`, `scripts`, `handlers`, `references` (every `src`, `href` and
/// `url(...)` of the DOM), `requests` (URLs in Chromium's network log), and the
/// screenshot's `png` (`width`, `height`, `colours`, `non_white`).
#[track_caller]
pub fn browse(scratch: &Scratch, html: &Path, artifact: &str) -> Value {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: `cargo xtask setup` installs Debian's chromium"
    );
    let url = format!(
        "file://{}",
        html.canonicalize().expect("the HTML report").display()
    );
    let dir = repo_root().join("target/html-report");
    std::fs::create_dir_all(&dir).expect("creating target/html-report");
    let png = dir.join(format!("{artifact}.png"));
    let _ = std::fs::remove_file(&png);
    let dom = scratch.path(&format!("{artifact}.dom.html"));
    let (log_dom, log_shot) = (
        scratch.path(&format!("{artifact}.dom.netlog.json")),
        scratch.path(&format!("{artifact}.shot.netlog.json")),
    );
    chromium(
        scratch,
        &[
            "--dump-dom".into(),
            format!("--log-net-log={}", log_dom.display()),
            url.clone(),
        ],
        Some(&dom),
    );
    chromium(
        scratch,
        &[
            "--window-size=1280,2400".into(),
            format!("--screenshot={}", png.display()),
            format!("--log-net-log={}", log_shot.display()),
            url,
        ],
        None,
    );
    assert!(
        png.exists(),
        "Chromium wrote no screenshot {}",
        png.display()
    );
    let out = Command::new("python3")
        .arg(repo_root().join("tests/consumers/html_page.py"))
        .args([&dom, &log_dom, &log_shot])
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "html_page.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut page: Value = serde_json::from_slice(&out.stdout).expect("html_page.py's JSON");
    page["png"] = png_summary(&png);
    page
}

/// `width`, `height`, the number of distinct `colours` and the share of pixels that are
/// not white (`non_white`) of a screenshot.
#[track_caller]
fn png_summary(path: &Path) -> Value {
    let decoder = png::Decoder::new(std::io::BufReader::new(
        File::open(path).expect("the screenshot"),
    ));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("PNG size")];
    let info = reader.next_frame(&mut buf).expect("the PNG's pixels");
    let bpp = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("screenshot colour type {other:?}"),
    };
    let pixels = buf[..info.buffer_size()].chunks_exact(bpp);
    let total = pixels.len();
    let mut colours = std::collections::HashSet::new();
    let mut non_white = 0usize;
    for p in pixels {
        colours.insert([p[0], p[1], p[2]]);
        non_white += usize::from(p[..3] != [255, 255, 255]);
    }
    serde_json::json!({
        "width": info.width,
        "height": info.height,
        "colours": colours.len(),
        "non_white": non_white as f64 / total as f64,
    })
}

/// Runs headless Chromium, cut off from every network (names resolve to nothing), with a
/// profile of its own under the scratch directory and none of its background traffic.
#[track_caller]
fn chromium(scratch: &Scratch, args: &[String], stdout: Option<&PathBuf>) {
    let profile = scratch.path("chromium-profile");
    let mut cmd = Command::new(CHROMIUM);
    cmd.args([
        "--headless",
        // Root (CI) cannot use Chromium's sandbox.
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--host-resolver-rules=MAP * ~NOTFOUND",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .stderr(Stdio::null());
    match stdout {
        Some(path) => cmd.stdout(File::create(path).expect("DOM file")),
        None => cmd.stdout(Stdio::null()),
    };
    let status = ChildGuard::spawn(&mut cmd).wait_with_limit(LIMIT);
    assert!(status.success(), "{cmd:?}: {status}");
}

/// The number of bars figure `id` draws in the colours of its legend (every bar chart's
/// series is in its legend).
#[track_caller]
pub fn bars(page: &Value, id: &str) -> u64 {
    let f = figure(page, id);
    f["legend"]
        .as_array()
        .expect("legend")
        .iter()
        .filter_map(|fill| f["fills"][fill.as_str().expect("fill")].as_u64())
        .sum()
}

/// Bars of figure `id` in one colour (`#RRGGBB`, upper case, as in its legend).
#[track_caller]
pub fn bars_in(page: &Value, id: &str, fill: &str) -> u64 {
    figure(page, id)["fills"][fill].as_u64().unwrap_or(0)
}

/// Figure `id` of the page, which must be there with an SVG.
#[track_caller]
pub fn figure<'a>(page: &'a Value, id: &str) -> &'a Value {
    let f = &page["figures"][id];
    assert!(
        f["svg"] == true,
        "no figure {id:?} with an SVG; figures: {:?}",
        page["figures"]
            .as_object()
            .map(|o| o.keys().collect::<Vec<_>>())
    );
    f
}

/// Asserts what every report page must be: no script, no event handler, no reference
/// outside the page, no request made, not blank, and each figure's axes labelled.
#[track_caller]
pub fn assert_self_contained_page(page: &Value) {
    assert_eq!(page["scripts"], 0, "no <script>");
    assert_eq!(page["handlers"], serde_json::json!([]), "no on* attributes");
    for r in page["references"].as_array().expect("references") {
        let r = r.as_str().expect("reference");
        assert!(r.starts_with('#'), "a reference outside the page: {r}");
    }
    assert_eq!(
        page["requests"],
        serde_json::json!([]),
        "requests in Chromium's network log"
    );
    let png = &page["png"];
    assert!(
        png["colours"].as_u64().expect("colours") > 16
            && png["non_white"].as_f64().expect("non_white") > 0.02,
        "the screenshot looks blank: {png}"
    );
    for (id, f) in page["figures"].as_object().expect("figures") {
        if f["svg"] != true {
            continue;
        }
        let texts = f["texts"].as_array().expect("texts").len();
        assert!(
            texts >= 4,
            "figure {id}: axis labels and descriptions ({texts} texts)"
        );
    }
}

/// Whether any text of figure `id`'s SVG contains `needle`.
#[track_caller]
pub fn figure_says(page: &Value, id: &str, needle: &str) -> bool {
    figure(page, id)["texts"]
        .as_array()
        .expect("texts")
        .iter()
        .any(|t| t.as_str().is_some_and(|t| t.contains(needle)))
}

/// Fill of the bars of the main quantity (calls, communication time).
pub const BLUE: &str = "#005A8C";
/// Fill of elapsed time behind communication time, and of time waited.
pub const GREY: &str = "#C8C8C8";
/// Fill of what is wrong: time a rank made others wait, bandwidth below expected.
pub const VERMILLION: &str = "#C03C00";

/// Asserts that the page draws what `profile` holds: per routine with bytes a calls and a
/// time chart with a bar per size bucket holding calls (all ranks together), a bar per rank
/// of elapsed and of communication time, per routine a bar per duration bucket holding
/// calls, who-is-late's bars per rank, a heat-map cell per pair of ranks that exchanged
/// bytes and per rank and time bin with MPI time; and that it is a [self-contained page](assert_self_contained_page).
#[track_caller]
pub fn assert_html_report_matches(page: &Value, profile: &Value) {
    use std::collections::{BTreeMap, BTreeSet};
    assert_self_contained_page(page);
    let ranks = profile["ranks"].as_array().expect("ranks");
    let mut sizes: BTreeMap<&str, (u64, u64, BTreeSet<String>)> = BTreeMap::new();
    let mut durations: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for r in ranks {
        for (name, s) in r["routines"].as_object().expect("routines") {
            let e = sizes.entry(name).or_default();
            e.0 += s["bytes"].as_u64().expect("bytes");
            e.1 += s["undecoded_calls"].as_u64().expect("undecoded_calls");
            for b in s["sizes"].as_array().expect("sizes") {
                if b["calls"].as_u64().expect("calls") > 0 {
                    e.2.insert(b["bucket"].to_string());
                }
            }
            if let Some(d) = s.get("durations") {
                let set = durations.entry(name).or_default();
                for b in d["buckets"].as_array().expect("buckets") {
                    if b["calls"].as_u64().expect("calls") > 0 {
                        set.insert(b["from_ns"].as_u64().expect("from_ns"));
                    }
                }
            }
        }
    }
    for (name, (bytes, undecoded, buckets)) in &sizes {
        if *bytes == 0 && *undecoded == 0 {
            continue;
        }
        for what in ["calls", "time"] {
            let id = format!("sizes-{name}-{what}");
            assert_eq!(
                bars(page, &id) as usize,
                buckets.len(),
                "{id}: a bar per size bucket with calls ({buckets:?})"
            );
            assert!(figure_says(page, &id, "message size"), "{id}: x axis");
            assert!(figure_says(page, &id, what), "{id}: y axis");
        }
    }
    for (name, buckets) in &durations {
        let id = format!("durations-{name}");
        assert_eq!(
            bars(page, &id) as usize,
            buckets.len(),
            "{id}: a bar per duration bucket with calls ({buckets:?})"
        );
        assert!(figure_says(page, &id, "call duration"), "{id}: x axis");
    }
    let n = ranks.len() as u64;
    // MPI communication time is drawn where a rank called an MPI routine but MPI_Init and
    // MPI_Finalize; an NCCL job's time is on the GPU, and is not.
    let by_mpi = ranks.iter().any(|r| {
        r["routines"]
            .as_object()
            .expect("routines")
            .iter()
            .any(|(name, s)| {
                name.starts_with("MPI_")
                    && !["MPI_Init", "MPI_Init_thread", "MPI_Finalize"].contains(&name.as_str())
                    && s["calls"].as_u64() > Some(0)
            })
    });
    if by_mpi {
        assert_eq!(
            bars_in(page, "ranks-comm", GREY),
            n,
            "an elapsed bar per rank"
        );
        assert_eq!(
            bars_in(page, "ranks-comm", BLUE),
            n,
            "a communication bar per rank"
        );
        assert!(figure_says(page, "ranks-comm", "rank"), "x axis");
    } else {
        assert!(
            page["figures"].get("ranks-comm").is_none(),
            "no MPI communication to draw: {:?}",
            page["figures"]["ranks-comm"]
        );
    }
    if by_mpi && n > 1 {
        for word in ["min", "max"] {
            assert!(
                figure_says(page, "ranks-comm", word),
                "the {word} rank is marked"
            );
        }
    }
    if let Some(late) = profile["skew"]["ranks"]
        .as_array()
        .filter(|r| !r.is_empty())
    {
        let k = late.len() as u64;
        assert_eq!(
            bars_in(page, "late-ranks", VERMILLION),
            k,
            "made others wait, per rank"
        );
        assert_eq!(bars_in(page, "late-ranks", GREY), k, "waited, per rank");
    }
    let pairs: BTreeSet<(u64, u64)> = ranks
        .iter()
        .flat_map(|r| {
            let me = r["rank"].as_u64().expect("rank");
            r["peers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["sent_bytes"].as_u64() > Some(0))
                .filter_map(move |p| p["peer"].as_u64().map(|peer| (me, peer)))
        })
        .collect();
    if let Some(t) = profile["timeline"]["ranks"]
        .as_array()
        .filter(|r| !r.is_empty())
    {
        let busy_bins: usize = t
            .iter()
            .map(|r| {
                r["busy_ns"]
                    .as_array()
                    .expect("busy_ns")
                    .iter()
                    .filter(|ns| ns.as_u64() > Some(0))
                    .count()
            })
            .sum();
        assert_eq!(
            heat_cells(page, "timeline") as usize,
            busy_bins,
            "a timeline cell per rank and bin with MPI time"
        );
    }
    if !pairs.is_empty() {
        assert_eq!(
            heat_cells(page, "peers-sent") as usize,
            pairs.len(),
            "a cell per pair that sent bytes: {pairs:?}"
        );
    }
}

/// The coloured cells of heat map `id` (every rect but the white background).
#[track_caller]
fn heat_cells(page: &Value, id: &str) -> u64 {
    figure(page, id)["fills"]
        .as_object()
        .expect("fills")
        .iter()
        .filter(|(fill, _)| *fill != "#FFFFFF")
        .map(|(_, n)| n.as_u64().expect("count"))
        .sum()
}

/// Asserts that the page's MPI routine table (all ranks together) holds the ranks' truths
/// added up, routine by routine, but for the routines in `ignore`.
#[track_caller]
pub fn assert_html_routine_table_equals_truths(page: &Value, truths: &[Value], ignore: &[&str]) {
    let mut want = std::collections::BTreeMap::<String, (u64, u64)>::new();
    for t in truths {
        for (name, (calls, bytes)) in crate::routine_table(&t["routines"]) {
            let e = want.entry(name).or_default();
            e.0 += calls;
            e.1 += bytes;
        }
    }
    let mut got = html_routine_table(page);
    got.retain(|name, _| !ignore.contains(&name.as_str()));
    assert_eq!(
        got, want,
        "the HTML routine table: (calls, bytes) per routine"
    );
}

/// (calls, bytes) per routine of the page's MPI routine table (all ranks together).
#[track_caller]
fn html_routine_table(page: &Value) -> std::collections::BTreeMap<String, (u64, u64)> {
    let rows = page["tables"]["routines"]
        .as_array()
        .expect("routine tables");
    let mut table = std::collections::BTreeMap::new();
    for row in rows {
        let cells: Vec<&str> = row
            .as_array()
            .expect("row")
            .iter()
            .map(|c| c.as_str().expect("cell"))
            .collect();
        // MPI routines: MPI_*, and the MPIX_* extensions (Open MPI 4.1's persistent
        // collectives).
        if cells.len() < 4 || !(cells[0].starts_with("MPI_") || cells[0].starts_with("MPIX_")) {
            continue;
        }
        let calls: u64 = cells[1].parse().expect("#calls");
        let bytes: u64 = cells[2].parse().expect("bytes");
        table.insert(cells[0].to_string(), (calls, bytes));
    }
    table
}
