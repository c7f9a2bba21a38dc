//! Link libwd_comp.so with a version script so only the API of
//! wd_comp.h is exported.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=libwd_comp.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libwd_comp.map");
}
