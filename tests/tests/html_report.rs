//! The HTML report as a browser shows it. The reports of real jobs are checked where those
//! jobs run (`mpi_record.rs`, `peers.rs`, `skew.rs`, `nccl.rs`); here, what those checks
//! stand on: a page that reaches outside itself or runs a script is caught, and a report
//! from `commtap report --profile` renders as the one `record` wrote.

use std::time::Duration;

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);

/// The checks catch what they are there to catch: an image and a background from the
/// network (requests Chromium made for the page, and references in its DOM), a script, an
/// event handler, a blank page.
#[test]
fn a_page_that_reaches_out_is_caught() {
    let scratch = Scratch::new("html-reaches-out");
    let html = scratch.path("bad.html");
    std::fs::write(
        &html,
        "<!DOCTYPE html><html><body>\
         <img src=\"http://commtap.invalid/x.png\" onerror=\"void 0\">\
         <div style=\"background:url(https://commtap.invalid/y.png)\">x</div>\
         <script>document.title = 'x'</script></body></html>",
    )
    .expect("writing the page");
    let page = browse(&scratch, &html, "reaches-out");
    assert_eq!(
        page["requests"],
        serde_json::json!([
            "http://commtap.invalid/x.png",
            "https://commtap.invalid/y.png"
        ]),
        "{page:#}"
    );
    assert_eq!(
        page["references"],
        serde_json::json!([
            "http://commtap.invalid/x.png",
            "https://commtap.invalid/y.png"
        ]),
        "{page:#}"
    );
    assert_eq!(page["scripts"], 1);
    assert_eq!(page["handlers"], serde_json::json!(["img onerror"]));
    let png = &page["png"];
    assert!(
        png["non_white"].as_f64().expect("non_white") < 0.02,
        "a page with one letter is as good as blank: {png}"
    );
}

/// `commtap report --profile FILE --html` draws a saved profile (its routine table is the
/// ranks' truths added up); a bad `--threshold` or a missing `--expected` file is a clear
/// error that writes no page.
#[test]
fn a_saved_profile_is_drawn_and_bad_options_are_refused() {
    let scratch = Scratch::new("html-saved");
    let (json, prefix) = (scratch.path("profile.json"), scratch.path("truth"));
    let prog = build_program("mpi_truth.c", Mpi::Mpich);
    let mut args: Vec<String> = ["record", "--format", "json", "-o", path_str(&json), "--"]
        .map(String::from)
        .to_vec();
    args.extend(Mpi::Mpich.launcher(2));
    args.push(prog.display().to_string());
    args.push(prefix.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    let (profile, truths) = (read_json(&json), read_truths(&prefix, 2));
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);

    let html = scratch.path("report.html");
    let run = run_commtap(
        &scratch,
        &[
            "report",
            "--profile",
            path_str(&json),
            "--html",
            path_str(&html),
        ],
        LIMIT,
    );
    assert!(run.status.success(), "{}", run.stderr);
    assert!(
        run.stdout.contains("Data for MPI rank 0 of 2:"),
        "the text report still goes to stdout"
    );
    let page = browse(&scratch, &html, "saved-profile");
    assert_html_report_matches(&page, &profile);
    // MPI_Finalize runs after the truths are written.
    assert_html_routine_table_equals_truths(&page, &truths, &["MPI_Finalize"]);

    let refused = scratch.path("refused.html");
    let seed = repo_root().join("tests/data/seed_003_rccl_ofi_plugin.txt");
    for (args, needle) in [
        (
            vec!["--expected", path_str(&seed), "--threshold", "1.5"],
            "expected a fraction in (0, 1]",
        ),
        (
            vec!["--expected", "/nonexistent/nccl-tests.txt"],
            "reading /nonexistent/nccl-tests.txt",
        ),
        (
            vec!["--expected", path_str(&seed)],
            "nccl-tests tables: pick one",
        ),
    ] {
        let mut all = vec![
            "report",
            "--profile",
            path_str(&json),
            "--html",
            path_str(&refused),
        ];
        all.extend(args);
        let run = run_commtap(&scratch, &all, LIMIT);
        assert!(!run.status.success(), "{all:?}");
        assert!(run.stderr.contains(needle), "{all:?}: {}", run.stderr);
        assert!(!refused.exists(), "{all:?} wrote a page");
    }
}
