//! Link libwd_embedded.so with a version script so only its entry point is
//! exported.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=libwd_embedded.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libwd_embedded.map");
}
