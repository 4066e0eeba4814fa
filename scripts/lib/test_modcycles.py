"""modcycles: the detector finds a cycle and only a cycle, and the repository has none."""
import pathlib
import tempfile
import unittest

import modcycles

REPO = pathlib.Path(__file__).resolve().parents[2]


def tree(files: dict) -> pathlib.Path:
    root = pathlib.Path(tempfile.mkdtemp())
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


class Detector(unittest.TestCase):
    def test_finds_a_three_module_cycle_through_a_submodule(self):
        src = tree({
            "a.rs": "use crate::b::X;\n",
            "b/mod.rs": "mod inner;\n",
            "b/inner.rs": "use crate::c::Y;\n",
            "c.rs": "fn f() { crate::a::g() }\n",
            "d.rs": "use crate::a::Z;\n",
        })
        self.assertEqual(modcycles.cycles(modcycles.edges(src)), [["a", "b", "c"]])

    def test_a_chain_and_comments_are_not_cycles(self):
        src = tree({
            "a.rs": "use crate::b::X;\n",
            "b.rs": "// see crate::a::X\nlet s = 1; // crate::a too\n",
        })
        self.assertEqual(modcycles.cycles(modcycles.edges(src)), [])

    def test_the_repository_has_no_cycle(self):
        self.assertEqual(modcycles.main(["modcycles", str(REPO)]), 0)


if __name__ == "__main__":
    unittest.main()
