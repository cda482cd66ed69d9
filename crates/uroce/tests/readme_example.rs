//! The README's "Use from Rust" program is `examples/hello_write.rs`
//! word for word (`UROCE_UPDATE_README=1` copies the example in).

const BEGIN: &str = "<!-- begin examples/hello_write.rs -->\n```rust\n";
const END: &str = "```\n<!-- end examples/hello_write.rs -->";

#[test]
fn the_readme_shows_the_example_ci_runs() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme_path = dir.join("../../README.md");
    let readme = std::fs::read_to_string(&readme_path).unwrap();
    let example = std::fs::read_to_string(dir.join("examples/hello_write.rs")).unwrap();
    let start = readme.find(BEGIN).expect("the README's begin marker") + BEGIN.len();
    let end = start + readme[start..].find(END).expect("the README's end marker");
    if readme[start..end] != example && std::env::var_os("UROCE_UPDATE_README").is_some() {
        let updated = format!("{}{example}{}", &readme[..start], &readme[end..]);
        std::fs::write(&readme_path, updated).unwrap();
        return;
    }
    assert!(
        readme[start..end] == example,
        "README.md's copy of examples/hello_write.rs differs (UROCE_UPDATE_README=1 updates it)"
    );
}
