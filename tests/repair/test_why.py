"""An unrepairable expert is shown with its reason, counted and explained, not as a bare number."""

from apps.repair.selectors import unrepairable_why


def test_unrepairable_reasons_are_counted_and_explained() -> None:
    listed = [["m", 0, 1, "no_candidate"], ["m", 0, 2, "no_candidate"], ["m", 1, 0, "no_blob_uri"]]
    line = unrepairable_why(listed, 5)
    assert line.startswith("2 no_candidate: no provider without it can take another copy; "
                           "1 no_blob_uri: no holder announces a blob")
    assert line.endswith("; 2 more not listed")
    assert unrepairable_why([], 0) == ""
