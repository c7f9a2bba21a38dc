//! The binding's idea of intel-ipsec-mb's C layout against the installed
//! header: a C program prints each `offsetof`/`sizeof`/enum value the
//! binding relies on. Skipped (and counted) without the header or a C
//! compiler.

use std::process::Command;

const HEADER: &str = "/usr/include/intel-ipsec-mb.h";

#[test]
fn layout_matches_the_installed_header() {
    if !std::path::Path::new(HEADER).exists() {
        wd_testutil::skip(
            "layout_matches_the_installed_header",
            "no intel-ipsec-mb.h (libipsec-mb-dev)",
        );
        return;
    }
    let want = wd_ipsecmb::assumed_layout();
    let dir = wd_testutil::tempdir("imb-abi");
    let src = dir.join("abi.c");
    let bin = dir.join("abi");
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <intel-ipsec-mb.h>\nint main(void) {\n",
    );
    for (expr, _) in &want {
        c.push_str(&format!("    printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("    return 0;\n}\n");
    std::fs::write(&src, c).unwrap();
    let cc = match Command::new("cc").args([&src, "-o", &bin]).output() {
        Ok(o) => o,
        Err(e) => {
            wd_testutil::skip(
                "layout_matches_the_installed_header",
                &format!("no C compiler: {e}"),
            );
            return;
        }
    };
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&bin).output().unwrap();
    let got: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(got.len(), want.len());
    for ((expr, mine), theirs) in want.iter().zip(got) {
        assert_eq!(*mine, theirs, "{expr}: binding {mine}, header {theirs}");
    }
}
