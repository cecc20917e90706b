"""Stored sentences: English in, the reader's language out, and text no template made left as written."""

from django.utils import translation

from kernel.sentences import said, stored


def test_a_stored_sentence_and_the_sentences_inside_it_are_said_in_chinese():
    detail = stored("exited with code %(code)s", code=3)
    message = stored("%(detail)s; retry %(n)s of %(max)s", detail=detail, n=1, max=2)
    assert message == "exited with code 3; retry 1 of 2"  # what the database and the API keep
    with translation.override("zh-hans"):
        assert said(message) == "以退出码 3 退出；第 1 次重试，共 2 次"
        assert said(stored("%(n)s GPUs", n="2.5")) == "2.5 块 GPU"
    with translation.override("en"):
        assert said(message) == message


def test_text_no_template_made_is_shown_as_written():
    with translation.override("zh-hans"):
        # Would fit `%(detail)s. %(suggestion)s`, but neither half is a known sentence: left alone.
        assert said("Back-off pulling image. Check the registry") == "Back-off pulling image. Check the registry"
        assert said("no GPU") == "no GPU"  # `%(n)s GPU` takes a number only
        # A value is looked up only among stored sentences: a queue named like a word stays its name.
        assert said(stored("submitted to queue %(queue)s", queue="running")) == "已提交到队列 running"
        assert said("") == "" and said(None) == ""
