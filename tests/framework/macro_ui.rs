//! Compile errors of `#[oar::to_static]`: each points at the offending span.

#[test]
fn to_static_compile_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
