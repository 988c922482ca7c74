#!/usr/bin/env python3
"""Tests of .ci/judge-skips on a saved log: SKIPPED lines of real test runs on the CI machine
(probe::btf's live_module_btf_parses_on_vmlinux, tests/kernel.rs's deny enforcement), libtest's
lines for tests/kernel.rs's two #[ignore]d child bodies, and a lab report in print_report's
format (xtask/src/lab/judge.rs) with arm64's N/A checks.

That a real skip in a real passing test reaches such a log at all (past libtest's capture) and
fails this judge is checked by gpu-trace-core's skip::tests, in `cargo test` (it needs cargo).

Run: python3 .ci/test_judge_skips.py   (.ci/run runs it before the suite)"""

import importlib.machinery
import importlib.util
import os
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
loader = importlib.machinery.SourceFileLoader("judge_skips", os.path.join(HERE, "judge-skips"))
spec = importlib.util.spec_from_loader("judge_skips", loader)
judge_skips = importlib.util.module_from_spec(spec)
loader.exec_module(judge_skips)


def read(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


LOG = read("testdata/skips.log")
EXPECTED = read("expected-skips")


class JudgeSkips(unittest.TestCase):
    def assert_unexpected_na(self, log, *words):
        """The judge fails `log`, naming an unexpected N/A whose line has each of `words`."""
        report, ok = judge_skips.judge(log, EXPECTED)
        self.assertFalse(ok)
        self.assertTrue(
            any("UNEXPECTED not-applicable lab check" in l and all(w in l for w in words)
                for l in report),
            "\n".join(report),
        )

    def test_the_saved_log_passes_against_this_machines_list(self):
        report, ok = judge_skips.judge(LOG, EXPECTED)
        self.assertTrue(ok, "\n".join(report))
        self.assertIn(
            "ci: 2 test(s) skipped, 2 ignored, 3 lab check(s) not applicable (0 unexpected)", report
        )
        # Each N/A is counted with its reason.
        self.assertTrue(
            any(l.startswith("ci:   N/A lab Debian 6.12.117+deb12-arm64") and "c.trace: this kernel has no KFD" in l
                for l in report),
            "\n".join(report),
        )

    def test_a_planted_unexpected_skip_fails_and_is_named(self):
        planted = LOG + "SKIPPED: every_syscall_hook_captures_the_same_calls: the kernel refused every hook\n"
        report, ok = judge_skips.judge(planted, EXPECTED)
        self.assertFalse(ok)
        self.assertIn(
            "ci: UNEXPECTED skip (not in the expected list): every_syscall_hook_captures_the_same_calls: "
            "the kernel refused every hook",
            report,
        )

    def test_an_expected_test_skipping_for_another_reason_fails(self):
        other = LOG.replace("no module BTF in /sys/kernel/btf", "cannot read /sys/kernel/btf")
        _, ok = judge_skips.judge(other, EXPECTED)
        self.assertFalse(ok)

    def test_an_unexpected_lab_na_fails(self):
        # An x86-64 kernel's check judged N/A: only arm64's missing KFD is expected.
        x86 = LOG.replace(
            "PASS  a.kfd_version  KFD GET_VERSION answers\n      KFD 1.11",
            "N/A   a.kfd_version  KFD GET_VERSION answers\n      this kernel's KFD serves no process without a GPU (a.kfd); as judged: x",
        )
        self.assert_unexpected_na(x86, "x86_64", ": a.kfd_version: ")

    def test_expected_skips_that_did_not_happen_are_listed_not_failed(self):
        quiet = "\n".join(l for l in LOG.splitlines() if "SKIPPED: deny enforcement" not in l)
        report, ok = judge_skips.judge(quiet, EXPECTED)
        self.assertTrue(ok)
        self.assertTrue(any(l.startswith("ci: expected but did not happen (information): skip deny enforcement") for l in report))

    def test_an_ignored_test_that_is_not_a_child_body_fails_and_is_named(self):
        for line, key in [
            ("test flaky_one ... ignored", "flaky_one"),
            ("test slow_one ... ignored, too slow for CI", "slow_one: too slow for CI"),
            # The lab's per-check tests are let through for their own reason only.
            ("test lab::judge::each::a_boot ... ignored, broken", "lab::judge::each::a_boot: broken"),
        ]:
            report, ok = judge_skips.judge(LOG + line + "\n", EXPECTED)
            self.assertFalse(ok, line)
            self.assertIn(f"ci: UNEXPECTED ignored test (not in the expected list): {key}", report)

    def test_arm64_na_is_accepted_only_for_the_checks_that_need_kfd(self):
        # b.load needs no KFD: on arm64 it is judged, never N/A, whatever the reason says.
        nv = LOG.replace(
            "N/A   c.trace        gpu-trace --vendor amd",
            "N/A   b.load         gpu-trace --vendor amd",
        )
        self.assert_unexpected_na(nv, "aarch64", ": b.load: ")

    def test_the_nobody_skips_are_accepted_only_for_their_tests(self):
        line = ("SKIPPED: the_walk_counts_the_processes_it_may_not_read: user nobody cannot run the "
                "test binary: setpriv: failed to execute /root/x/late_attach-1: Permission denied\n")
        _, ok = judge_skips.judge(LOG + line, EXPECTED)
        self.assertTrue(ok)
        for other in [
            line.replace("the_walk_counts_the_processes_it_may_not_read", "another_test"),
            # The child crashed: not the exec refusal the skip is for.
            "SKIPPED: the_walk_counts_the_processes_it_may_not_read: the test binary did not run "
            "as nobody (signal: 11 (SIGSEGV)): \n",
        ]:
            _, ok = judge_skips.judge(LOG + other, EXPECTED)
            self.assertFalse(ok, other)

    def test_a_line_without_a_reason_is_refused(self):
        with self.assertRaises(ValueError):
            judge_skips.parse_expected("skip some_test: *\n")


if __name__ == "__main__":
    unittest.main()
