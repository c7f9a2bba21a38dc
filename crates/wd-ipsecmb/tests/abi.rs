//! The binding's idea of intel-ipsec-mb's C layout against the installed
//! header: a C program prints each `offsetof`/`sizeof`/enum value the
//! binding relies on. Skipped (and counted) without the header or a C
//! compiler.

#[test]
fn layout_matches_the_installed_header() {
    wd_testutil::check_c_layout(
        "layout_matches_the_installed_header",
        "intel-ipsec-mb.h",
        &wd_ipsecmb::assumed_layout(),
    );
}
