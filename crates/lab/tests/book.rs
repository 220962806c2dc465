//! `farside lab report --book`: `docs/RESULTS.md` is exactly what the kept result files
//! and the fragments under `docs/book/` give, and rendering it is reproducible.

use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

#[test]
fn the_book_is_reproduced_from_the_kept_files() {
    let render: farside_lab::book::RenderRun = &|d| farside_lab::table_any(d);
    let book = farside_lab::book::render(root(), render).expect("every section renders");
    let again = farside_lab::book::render(root(), render).unwrap();
    assert_eq!(book, again, "two renderings differ");
    let kept = std::fs::read_to_string(root().join(farside_lab::book::BOOK_FILE)).unwrap();
    assert!(
        kept == book,
        "docs/RESULTS.md is not what the kept files give: run `farside lab report --book` \
         (first differing line: {:?})",
        kept.lines()
            .zip(book.lines())
            .find(|(a, b)| a != b)
            .or(Some(("<end>", "<end>")))
    );
}

#[test]
fn every_section_names_existing_kept_results_and_renders_alone() {
    let render: farside_lab::book::RenderRun = &|d| farside_lab::table_any(d);
    for part in farside_lab::book::SECTIONS {
        for s in part.sections {
            for k in s.current {
                assert!(
                    root().join(k.path()).exists(),
                    "{}: {} missing",
                    s.id,
                    k.path()
                );
            }
            let text = farside_lab::book::section(root(), s.id, render).unwrap();
            assert!(text.starts_with(&format!("### {}\n", s.title)), "{}", s.id);
            assert!(!text.contains("@current"), "{}: mark left in", s.id);
        }
    }
}
