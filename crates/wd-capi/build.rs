//! Link libwd.so with a version script so only the public C API is exported.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=libwd.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libwd.map");
}
