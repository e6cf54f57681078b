//! The report: markdown on stdout, JSON at `--json`, and with `--docs` a documentation page.

mod docs;
mod json;
mod markdown;
mod tables;
mod targets;

use crate::options::Args;
use crate::run::Report;

/// Prints the markdown report and writes the JSON (and the documentation page, if asked).
pub fn finish(args: &Args, report: &Report, version: &str) -> Result<(), String> {
    let tables = markdown::markdown(args, report, version);
    println!("{tables}");
    json::write_json(args, report, version)?;
    if let Some(path) = &args.docs {
        docs::write(path, args, report, version, &tables)?;
    }
    Ok(())
}
