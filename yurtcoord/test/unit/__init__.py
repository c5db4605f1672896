"""The unit tier: tests that start no process and open no socket.

Logic under a ``twisted.internet.task.Clock`` and the in-memory fakes of
``yurtcoord.testing``; exact timing is proved here. The whole tier runs in under two
minutes and runs on every supported Python (docs/testing.md).
"""
