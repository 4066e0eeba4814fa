"""Self-tests of scripts/image-mtimes.sh (the image build's content-based freshness), on a
throwaway tree: what it gives back must make cargo rebuild exactly what changed.

    python3 -m unittest discover -s scripts/lib -p 'test_*.py'
"""
import os
import subprocess
import tempfile
import time
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "image-mtimes.sh")
OLD = 1_000_000_000  # 2001: an mtime no file in the tree has by accident


class ImageMtimes(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name
        for path, text in {
            "Cargo.toml": "[workspace]\n",
            "Cargo.lock": "",
            "src/main.rs": "fn main() {}\n",
            "crates/net/src/lib.rs": "pub fn f() {}\n",
            "target/release/out": "built\n",
        }.items():
            self.write(path, text)

    def tearDown(self):
        self.dir.cleanup()

    def write(self, path, text):
        full = os.path.join(self.root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)

    def run_script(self, verb):
        subprocess.run(["sh", SCRIPT, verb], cwd=self.root, check=True)

    def mtime(self, path):
        return int(os.stat(os.path.join(self.root, path)).st_mtime)

    def age_everything(self):
        """What `COPY` does to a tree: every file gets the same new mtime (here an old one, so a
        restore that leaves a file alone is told apart from one that touches it now)."""
        for base, _, files in os.walk(self.root):
            for name in files:
                os.utime(os.path.join(base, name), (OLD, OLD))

    def test_first_build_trusts_nothing(self):
        self.age_everything()
        before = int(time.time())
        self.run_script("restore")
        self.assertGreaterEqual(self.mtime("src/main.rs"), before)
        self.assertGreaterEqual(self.mtime("crates/net/src/lib.rs"), before)
        self.assertEqual(self.mtime("target/release/out"), OLD, "outputs are not sources")

    def test_unchanged_files_get_the_last_builds_mtime_and_changed_ones_now(self):
        self.run_script("restore")
        os.utime(os.path.join(self.root, "src/main.rs"), (OLD + 5, OLD + 5))
        os.utime(os.path.join(self.root, "crates/net/src/lib.rs"), (OLD + 7, OLD + 7))
        self.run_script("save")
        # The next build's COPY: new mtimes everywhere, one file's content changed.
        for path in ("src/main.rs", "crates/net/src/lib.rs"):
            os.utime(os.path.join(self.root, path), (OLD + 100, OLD + 100))
        self.write("src/main.rs", "fn main() { println!(); }\n")
        before = int(time.time())
        self.run_script("restore")
        self.assertEqual(self.mtime("crates/net/src/lib.rs"), OLD + 7)
        self.assertGreaterEqual(self.mtime("src/main.rs"), before)

    def test_a_build_that_did_not_save_leaves_nothing_to_trust(self):
        self.run_script("restore")
        self.run_script("save")
        self.run_script("restore")  # this build fails: no save
        self.age_everything()
        before = int(time.time())
        self.run_script("restore")
        self.assertGreaterEqual(self.mtime("crates/net/src/lib.rs"), before)

    def test_an_unknown_verb_is_refused(self):
        r = subprocess.run(["sh", SCRIPT, "bogus"], cwd=self.root, capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("usage", r.stderr)


if __name__ == "__main__":
    unittest.main()
