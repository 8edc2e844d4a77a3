//! Records the commit the binary is built from, so a benchmark's JSON names the code that ran
//! wherever the binary is run from (the working directory's checkout may be another commit, or
//! none). Rebuilt when HEAD moves (a commit, a checkout, a reset).

fn main() {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
    };
    let head = git(&["rev-parse", "HEAD"]).unwrap_or_default();
    println!("cargo:rustc-env=LOADLINK_BUILD_COMMIT={head}");
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/logs/HEAD");
    }
}
