#!/usr/bin/env python3
"""Tests of scripts/check-layers.py: the source read as the compiler reads it, and cycles found.

Run: python3 scripts/check_layers_test.py (CI runs it before the check itself)."""

import importlib.util
import unittest
from pathlib import Path

spec = importlib.util.spec_from_file_location("check_layers", Path(__file__).with_name("check-layers.py"))
layers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layers)


def uses(text, module=("a",), others=("b",)):
    """The modules `text`, as module `a`, is found to use."""
    sources = {(): "mod a; mod b;", module: text}
    for o in others:
        sources.setdefault((o,), "pub struct X; pub fn g() {}")
    return set(layers.graph(sources)[module])


class Lexing(unittest.TestCase):
    def test_a_url_in_a_string_hides_nothing_after_it(self):
        self.assertEqual(uses('const U: &str = "https://x"; fn f() { crate::b::g() }'), {("b",)})

    def test_a_double_quote_char_literal_is_not_a_string(self):
        self.assertEqual(uses("""fn f(c: char) -> bool { c == '"' || crate::b::g() == () }"""), {("b",)})

    def test_escaped_quote_chars_and_strings(self):
        self.assertEqual(uses(r"""const Q: char = '\''; const S: &str = "\" crate::a"; fn f() { crate::b::g() }"""),
                         {("b",)})
        self.assertEqual(uses(r"""const B: &[u8] = b"\""; const C: u8 = b'"'; use crate::b::X;"""), {("b",)})

    def test_lifetimes_and_labels_are_not_char_literals(self):
        text = "fn f<'a, 'b>(x: &'a str) -> &'a str { 'outer: loop { break 'outer; } crate::b::g(); x }"
        self.assertEqual(uses(text), {("b",)})
        self.assertEqual([t.text for t in layers.tokenize("&'static str") if t.kind == "lifetime"], ["'static"])

    def test_unicode_escape_char(self):
        self.assertEqual(uses(r"const E: char = '\u{1F600}'; use crate::b::X;"), {("b",)})

    def test_paths_inside_literals_and_comments_are_not_seen(self):
        self.assertEqual(uses('const S: &str = "crate::b::X";'), set())
        self.assertEqual(uses('const S: &str = r#"crate::b::X "quoted" "#;'), set())
        self.assertEqual(uses('const S: &[u8] = br##"crate::b::X "# still"##;'), set())
        self.assertEqual(uses("/// crate::b::X\n//! crate::b::X\nfn f() {}"), set())
        self.assertEqual(uses("/* outer /* nested */ crate::b::X */ fn f() {}"), set())

    def test_what_follows_a_raw_string_or_nested_comment_is_seen(self):
        self.assertEqual(uses('const S: &str = r#"a " b"#; fn f() { crate::b::g() }'), {("b",)})
        self.assertEqual(uses("/* /* */ */ fn f() { crate::b::g() }"), {("b",)})

    def test_raw_identifiers(self):
        self.assertEqual([t.text for t in layers.tokenize("r#type")], ["type"])


class TestItems(unittest.TestCase):
    def test_a_test_item_anywhere_is_left_out(self):
        text = "#[cfg(test)]\nfn helper() { crate::b::g() }\npub fn real() {}"
        self.assertEqual(uses(text), set())
        self.assertEqual(uses("#[cfg(all(test, unix))]\nuse crate::b::X;"), set())

    def test_a_not_test_item_is_kept(self):
        self.assertEqual(uses("#[cfg(not(test))]\nuse crate::b::X;"), {("b",)})
        self.assertEqual(uses("#[cfg(any(test, unix))]\nuse crate::b::X;"), {("b",)})

    def test_a_test_field_leaves_the_rest_of_the_struct(self):
        text = "struct S {\n #[cfg(test)]\n probe: u8,\n x: crate::b::X,\n}"
        self.assertEqual(uses(text), {("b",)})

    def test_a_test_module_file_is_left_out(self):
        sources = {(): "mod a; mod b;", ("a",): "#[cfg(test)]\nmod tests;\npub struct Y;",
                   ("a", "tests"): "use crate::b::X;", ("b",): "use crate::a::Y;"}
        self.assertEqual(layers.find_cycles(layers.folded(layers.graph(sources))), [])
        sources[("a",)] = "mod tests; pub struct Y;"
        self.assertEqual(layers.find_cycles(layers.folded(layers.graph(sources))), [[("a",), ("b",)]])

    def test_an_inner_test_attribute_leaves_its_file_out(self):
        sources = {(): "mod a; mod b;", ("a",): "#![cfg(test)]\nuse crate::b::X;", ("b",): "use crate::a::Y;"}
        self.assertEqual(layers.find_cycles(layers.graph(sources)), [])
        sources[("a",)] = "use crate::b::X;"
        self.assertEqual(layers.find_cycles(layers.graph(sources)), [[("a",), ("b",)]])


class Paths(unittest.TestCase):
    def test_use_trees(self):
        toks = layers.tokenize("crate::x::{a, b::{c, d as e}, self, f::*};")
        paths, _ = layers.use_trees(toks, 0)
        self.assertEqual(paths, [["crate", "x", "a"], ["crate", "x", "b", "c"], ["crate", "x", "b", "d"],
                                 ["crate", "x"], ["crate", "x", "f", "*"]])

    def test_an_alias_named_like_a_keyword_part_is_kept_whole(self):
        # `base` holds "as": the old reader cut the path there.
        sources = {(): "mod a; mod base;", ("a",): "use crate::base::X;", ("base",): "pub struct X;"}
        self.assertEqual(set(layers.graph(sources)[("a",)]), {("base",)})

    def test_super_self_and_bare_child_paths(self):
        sources = {(): "mod p;", ("p",): "mod c; mod d; fn f() { c::g() }",
                   ("p", "c"): "pub fn g() { super::d::h() }", ("p", "d"): "pub fn h() {}"}
        g = layers.graph(sources)
        self.assertEqual(set(g[("p",)]), {("p", "c")})
        self.assertEqual(set(g[("p", "c")]), {("p", "d")})

    def test_an_inline_modules_super_is_its_file(self):
        sources = {(): "mod p;", ("p",): "mod c; pub struct M;", ("p", "c"): "pub struct X; mod simd { use super::X; }"}
        self.assertEqual(set(layers.graph(sources)[("p", "c")]), set())
        sources[("p", "c")] = "mod simd { use super::super::M; }"
        self.assertEqual(set(layers.graph(sources)[("p", "c")]), {("p",)})

    def test_re_exports_are_followed_to_their_definition(self):
        sources = {(): "mod f; mod a;", ("f",): "mod inner; pub use inner::X;",
                   ("f", "inner"): "pub struct X; use crate::a::Y;", ("a",): "pub struct Y; use crate::f::X;"}
        g = layers.graph(sources)
        self.assertEqual(set(g[("a",)]), {("f", "inner")})
        self.assertEqual(set(g[("f",)]), set())

    def test_a_facade_that_uses_what_it_re_exports_depends_on_it(self):
        sources = {(): "mod f;", ("f",): "mod inner; pub use inner::X; pub struct Y { x: X }",
                   ("f", "inner"): "pub struct X; use super::Y;"}
        g = layers.graph(sources)
        self.assertEqual(set(g[("f",)]), {("f", "inner")})
        self.assertEqual(layers.find_cycles(g), [[("f",), ("f", "inner")]])

    def test_glob_re_exports_within_the_crate_are_followed(self):
        sources = {(): "mod f; mod a;", ("f",): "mod inner; pub use inner::*;",
                   ("f", "inner"): "pub const X: u8 = 1;", ("a",): "fn g() -> u8 { crate::f::X }"}
        self.assertEqual(set(layers.graph(sources)[("a",)]), {("f", "inner")})

    def test_a_glob_over_another_crate_stays_the_facades(self):
        sources = {(): "mod f; mod a;", ("f",): "pub use other::m::*;", ("a",): "const M: u64 = crate::f::MAX;"}
        self.assertEqual(set(layers.graph(sources)[("a",)]), {("f",)})


class Cycles(unittest.TestCase):
    def test_a_cycle_planted_behind_a_url_string_is_found(self):
        sources = {(): "mod a; mod b;",
                   ("a",): 'const U: &str = "https://x"; pub fn f() { crate::b::g() }',
                   ("b",): "pub fn g() { crate::a::f() }"}
        self.assertEqual(layers.find_cycles(layers.graph(sources)), [[("a",), ("b",)]])

    def test_a_cycle_between_top_level_modules_through_nested_ones(self):
        sources = {(): "mod a; mod b;", ("a",): "mod x;", ("a", "x"): "use crate::b::y::Z;",
                   ("b",): "pub mod y;", ("b", "y"): "pub struct Z; use crate::a::x::W;"}
        g = layers.graph(sources)
        self.assertEqual(layers.find_cycles(g), [[("a", "x"), ("b", "y")]])
        self.assertEqual(layers.find_cycles(layers.folded(g)), [[("a",), ("b",)]])

    def test_no_cycle(self):
        sources = {(): "mod a; mod b;", ("a",): "use crate::b::X;", ("b",): "pub struct X;"}
        self.assertEqual(layers.find_cycles(layers.graph(sources)), [])


if __name__ == "__main__":
    unittest.main()
