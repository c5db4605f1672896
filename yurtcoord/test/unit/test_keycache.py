"""Component key cache file: format, percent-encoding, atomic writes, crash recovery."""

import os

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial import unittest

from yurtcoord.pool.keycache import (
    KEY_CACHE_FILE_NAME, KEYS_PER_PIECE, SORTED_KEYS_LIMIT, ComponentKeyCache, KeyCacheCorrupt,
    decode_field, encode_field, format_lines, format_pieces, parse_lines,
)
from yurtcoord.pool.keys import ResourceId

PODS = ResourceId("", "v1", "pods")
NODES = ResourceId("", "v1", "nodes")
SLICES = ResourceId("discovery.k8s.io", "v1", "endpointslices")


class FormatTests(unittest.TestCase):
    def test_yurthub_format_reads_as_before(self):
        text = ("kubelet#_v1_pods:/registry/pods/default/a,/registry/pods/default/b;"
                "_v1_nodes:/registry/minions/n1\n"
                "kube-proxy#discovery.k8s.io_v1_endpointslices:/registry/endpointslices/d/s")
        cache = parse_lines(text)
        self.assertEqual(cache, {
            "kubelet": {PODS: {"/registry/pods/default/a", "/registry/pods/default/b"},
                        NODES: {"/registry/minions/n1"}},
            "kube-proxy": {SLICES: {"/registry/endpointslices/d/s"}},
        })

    def test_written_format_without_special_characters_is_plain(self):
        cache = {"kubelet": {PODS: {"/registry/pods/default/b", "/registry/pods/default/a"},
                             NODES: {"/registry/minions/n1"}}}
        self.assertEqual(format_lines(cache),
                         "kubelet#_v1_nodes:/registry/minions/n1;"
                         "_v1_pods:/registry/pods/default/a,/registry/pods/default/b")

    def test_empty_component_and_resource(self):
        cache = {"a": {}, "b": {PODS: set()}}
        self.assertEqual(parse_lines(format_lines(cache)), cache)

    def test_separator_characters_in_names_round_trip(self):
        # The seed wrote these raw; "system:node:x" split the line into garbage.
        keys = {"/registry/clusterroles/system:node:edge-1", "/registry/x/a,b", "/r/c;d",
                "/r/e#f", "/r/100%", "/r/%41"}
        cache = {"comp:1#x": {ResourceId("rbac.authorization.k8s.io", "v1", "cluster_roles"):
                              keys}}
        text = format_lines(cache)
        self.assertEqual(text.count("#"), 1)
        self.assertEqual(text.count(":"), 1)
        self.assertEqual(text.count(","), len(keys) - 1)
        self.assertNotIn(";", text)
        self.assertEqual(parse_lines(text), cache)
        self.assertIn("system%3Anode%3Aedge-1", text)

    @settings(max_examples=200, deadline=None)
    @given(st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.dictionaries(
            st.builds(ResourceId, st.text(max_size=6), st.text(max_size=4),
                      st.text(min_size=1, max_size=6)),
            st.sets(st.text(min_size=1, max_size=12), max_size=4),
            max_size=3),
        max_size=3))
    def test_round_trip_any_text(self, cache):
        self.assertEqual(parse_lines(format_lines(cache)), cache)

    @given(st.text())
    def test_field_encoding_round_trip(self, text):
        self.assertEqual(decode_field(encode_field(text)), text)

    def test_malformed_lines_name_file_and_line(self):
        bad = [
            "kubelet_v1_pods:/a",  # no '#'
            "kubelet#a#b",  # two '#'
            "kubelet#_v1_pods",  # no ':'
            "kubelet#v1_pods:/a",  # two-part gvr
            "kubelet#_v1_pods:/a,,/b",  # empty key
            "kubelet#_v1_pods:/a%zz",  # bad escape
            "#_v1_pods:/a",  # empty component
        ]
        for line in bad:
            with self.assertRaises(KeyCacheCorrupt) as ctx:
                parse_lines("ok#_v1_pods:/x\n\n" + line + "\n", "/some/file")
            self.assertEqual(ctx.exception.line_number, 3)
            self.assertIn("/some/file:3:", str(ctx.exception))


class KeyCacheFileCase(unittest.TestCase):
    """A test with ``path``, the key cache file in a fresh directory, and ``read()``."""

    def setUp(self):
        self.dir = self.mktemp()
        os.makedirs(self.dir)
        self.path = os.path.join(self.dir, KEY_CACHE_FILE_NAME)

    def read(self):
        with open(self.path) as f:
            return f.read()


class FileTests(KeyCacheFileCase):

    def test_missing_file_is_empty(self):
        cache = ComponentKeyCache(self.path).load()
        self.assertEqual(cache.components(), [])
        self.assertFalse(os.path.exists(self.path))

    def test_write_and_reload(self):
        cache = ComponentKeyCache.in_directory(self.dir).load()
        cache.add("kubelet", PODS, ["/registry/pods/a/b"])
        cache.add("kubelet", NODES, ["/registry/minions/n"])
        self.assertTrue(cache.dirty)
        cache.flush()
        self.assertFalse(cache.dirty)
        self.assertEqual(self.read(),
                         "kubelet#_v1_nodes:/registry/minions/n;_v1_pods:/registry/pods/a/b")
        again = ComponentKeyCache(self.path).load()
        self.assertEqual(again.keys("kubelet"), {"/registry/pods/a/b", "/registry/minions/n"})
        self.assertEqual(again.keys("kubelet", PODS), {"/registry/pods/a/b"})
        self.assertEqual(again.resources("kubelet"), [NODES, PODS])
        self.assertEqual(os.listdir(self.dir), [KEY_CACHE_FILE_NAME])

    def test_a_snapshot_is_written_as_it_was_taken(self):
        # The file's text is made from the snapshot when it is written (in a thread, for
        # the pool store), so changes made meanwhile on the reactor must not leak into it.
        cache = ComponentKeyCache.in_directory(self.dir, rebuilt_components=()).load()
        cache.add("leader-yurthub", SLICES, ["/registry/endpointslices/d/a",
                                             "/registry/endpointslices/d/b"])
        cache.add("kubelet", PODS, ["/registry/pods/a/system:node"])
        taken = cache.snapshot()
        snapshot = cache.snapshot_for_writing()
        self.assertFalse(cache.dirty)
        cache.discard("leader-yurthub", SLICES, ["/registry/endpointslices/d/a"])
        cache.add("leader-yurthub", SLICES, ["/registry/endpointslices/d/c"])
        cache.drop("kubelet")
        self.assertTrue(cache.dirty)
        cache.write_snapshot(snapshot)
        self.assertEqual(self.read(), format_lines(taken))
        self.assertEqual(self.read(),
                         "kubelet#_v1_pods:/registry/pods/a/system%3Anode\n"
                         "leader-yurthub#discovery.k8s.io_v1_endpointslices:"
                         "/registry/endpointslices/d/a,/registry/endpointslices/d/b")
        cache.flush()
        self.assertEqual(ComponentKeyCache(self.path, rebuilt_components=()).load().snapshot(),
                         cache.snapshot())

    def test_flush_without_changes_does_not_write(self):
        cache = ComponentKeyCache(self.path).load()
        cache.add("c", PODS, [])
        cache.flush()
        self.assertFalse(os.path.exists(self.path))

    def test_discard_set_drop(self):
        cache = ComponentKeyCache(self.path).load()
        cache.add("c", PODS, ["/p/1", "/p/2"])
        cache.discard("c", PODS, ["/p/1", "/p/absent"])
        self.assertEqual(cache.keys("c", PODS), {"/p/2"})
        cache.set_resource("c", NODES, ["/n/1"])
        cache.set_component("d", {PODS: ["/p/9"]})
        cache.drop("c")
        cache.flush()
        self.assertEqual(self.read(), "d#_v1_pods:/p/9")

    def test_pool_scoped_component_not_trusted_from_file(self):
        with open(self.path, "w") as f:
            f.write("leader-yurthub#_v1_endpoints:/registry/services/endpoints/a/b\n"
                    "kubelet#_v1_pods:/registry/pods/a/b\n")
        cache = ComponentKeyCache(self.path).load()
        self.assertEqual(cache.components(), ["kubelet"])

    def test_leftover_temp_files_removed_and_real_file_kept(self):
        with open(self.path, "w") as f:
            f.write("kubelet#_v1_pods:/registry/pods/a/b\n")
        leftovers = [os.path.join(self.dir, "." + KEY_CACHE_FILE_NAME + ".abc123.tmp"),
                     os.path.join(self.dir, "." + KEY_CACHE_FILE_NAME + ".zzz.tmp")]
        # A crash mid-write: a truncated temp file and an empty one.
        with open(leftovers[0], "w") as f:
            f.write("kubelet#_v1_pods:/registry/po")
        open(leftovers[1], "w").close()
        cache = ComponentKeyCache(self.path).load()
        self.assertEqual(cache.keys("kubelet"), {"/registry/pods/a/b"})
        self.assertEqual(os.listdir(self.dir), [KEY_CACHE_FILE_NAME])

    def test_crash_before_rename_leaves_old_file(self):
        with open(self.path, "w") as f:
            f.write("kubelet#_v1_pods:/old\n")
        cache = ComponentKeyCache(self.path).load()
        cache.add("kubelet", PODS, ["/new"])
        real_replace = os.replace

        def crash(src, dst):
            raise OSError("simulated crash before rename")

        os.replace = crash
        try:
            self.assertRaises(OSError, cache.write)
        finally:
            os.replace = real_replace
        self.assertEqual(self.read(), "kubelet#_v1_pods:/old\n")
        self.assertEqual(os.listdir(self.dir), [KEY_CACHE_FILE_NAME])
        self.assertTrue(cache.dirty)
        cache.flush()
        self.assertEqual(ComponentKeyCache(self.path).load().keys("kubelet"), {"/old", "/new"})

    def test_malformed_file_names_file_and_line(self):
        with open(self.path, "w") as f:
            f.write("kubelet#_v1_pods:/a\nbroken line\n")
        with self.assertRaises(KeyCacheCorrupt) as ctx:
            ComponentKeyCache(self.path).load()
        self.assertIn(self.path + ":2:", str(ctx.exception))

    def test_malformed_file_is_set_aside_and_the_cache_starts_empty(self):
        with open(self.path, "w") as f:
            f.write("kubelet#_v1_pods:/a\nbroken line\n")
        cache = ComponentKeyCache(self.path).load_or_set_aside()
        self.assertEqual(cache.components(), [])
        self.assertFalse(os.path.exists(self.path))
        with open(self.path + ".corrupt") as f:
            self.assertEqual(f.read(), "kubelet#_v1_pods:/a\nbroken line\n")
        cache.add("kubelet", PODS, ["/registry/pods/a/b"])
        cache.flush()
        self.assertEqual(self.read(), "kubelet#_v1_pods:/registry/pods/a/b")

    def test_good_file_loads_the_same_either_way(self):
        with open(self.path, "w") as f:
            f.write("kubelet#_v1_pods:/a\n")
        cache = ComponentKeyCache(self.path).load_or_set_aside()
        self.assertEqual(cache.keys("kubelet"), {"/a"})
        self.assertFalse(os.path.exists(self.path + ".corrupt"))

    def test_not_utf8_names_line(self):
        with open(self.path, "wb") as f:
            f.write(b"kubelet#_v1_pods:/a\nx#_v1_pods:/\xff\n")
        with self.assertRaises(KeyCacheCorrupt) as ctx:
            ComponentKeyCache(self.path).load()
        self.assertEqual(ctx.exception.line_number, 2)


class YurthubReaderError(ValueError):
    """The port below refused the file, as yurthub's reader would."""


def yurthub_reader(text):
    """yurthub's rules for reading ``component-key-cache``, restated for checking our file.

    - an empty file is an empty cache;
    - otherwise the whole text is split on every line break, and each piece (an empty
      one after a trailing line break too) must split on ``#`` into exactly two fields:
      the component (taken as it is) and its resources;
    - non-empty resources split on ``;`` into groups; a group must split on ``:`` into
      exactly two fields, and the first of them on ``_`` into exactly three (group,
      version, resource, any of them may be empty);
    - non-empty keys split on ``,`` and are taken as they are (no unescaping);
    - a component on a later line replaces the same component on an earlier one.

    Returns ``{component: {(group, version, resource): set(keys)}}``.
    """
    cache = {}
    if not text:
        return cache
    for number, line in enumerate(text.split("\n")):
        fields = line.split("#")
        if len(fields) != 2:
            raise YurthubReaderError(f"failed to parse line {number}, invalid format")
        component, groups = fields
        resources = {}
        if groups:
            for group in groups.split(";"):
                parts = group.split(":")
                if len(parts) != 2:
                    raise YurthubReaderError(f"failed to parse gvr keys {group!r} at line {number}")
                gvr = parts[0].split("_")
                if len(gvr) != 3:
                    raise YurthubReaderError(f"failed to parse gvr {parts[0]!r} at line {number}")
                resources[tuple(gvr)] = set(parts[1].split(",")) if parts[1] else set()
        cache[component] = resources
    return cache


def as_yurthub_sees(cache):
    return {component: {(r.group, r.version, r.resource): set(keys)
                        for r, keys in resources.items()}
            for component, resources in cache.items()}


plain_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1,
                     max_size=10)


class YurthubCompatibilityTests(KeyCacheFileCase):
    """What we write is read by yurthub on the same local_cache_dir after a rollback."""

    def test_port_reads_a_file_yurthub_writes(self):
        text = ("kubelet#_v1_pods:/registry/pods/default/a,/registry/pods/default/b;"
                "_v1_nodes:/registry/minions/n1\n"
                "kube-proxy#discovery.k8s.io_v1_endpointslices:/registry/endpointslices/d/s")
        self.assertEqual(yurthub_reader(text), {
            "kubelet": {("", "v1", "pods"): {"/registry/pods/default/a",
                                             "/registry/pods/default/b"},
                        ("", "v1", "nodes"): {"/registry/minions/n1"}},
            "kube-proxy": {("discovery.k8s.io", "v1", "endpointslices"):
                           {"/registry/endpointslices/d/s"}},
        })
        self.assertEqual(yurthub_reader(""), {})
        self.assertRaises(YurthubReaderError, yurthub_reader, text + "\n")
        self.assertRaises(YurthubReaderError, yurthub_reader, "a#_v1_pods:/x\n\nb#")

    def test_the_file_we_write_is_read_by_yurthub(self):
        cache = ComponentKeyCache(self.path).load()
        cache.add("kubelet", PODS, ["/registry/pods/a/b", "/registry/pods/a/c"])
        cache.add("kubelet", NODES, ["/registry/minions/n"])
        cache.add("kube-proxy", SLICES, ["/registry/endpointslices/d/s"])
        cache.flush()
        self.assertEqual(yurthub_reader(self.read()), as_yurthub_sees(cache.snapshot()))
        cache.drop("kubelet")
        cache.drop("kube-proxy")
        cache.flush()
        self.assertEqual(self.read(), "")
        self.assertEqual(yurthub_reader(self.read()), {})

    @settings(max_examples=50, deadline=None, derandomize=True)
    @given(st.dictionaries(
        plain_name,
        st.dictionaries(
            st.builds(ResourceId, st.sampled_from(["", "apps", "discovery.k8s.io"]),
                      st.sampled_from(["v1", "v1beta1"]), plain_name),
            st.sets(plain_name.map(lambda n: "/registry/x/" + n), max_size=4),
            max_size=3),
        max_size=4))
    def test_any_cache_without_separators_reads_the_same_in_yurthub(self, cache):
        self.assertEqual(yurthub_reader(format_lines(cache)), as_yurthub_sees(cache))

    def test_our_older_files_with_a_trailing_line_break_still_read(self):
        with open(self.path, "w") as f:
            f.write("kubelet#_v1_pods:/registry/pods/a/b\n"
                    "x%3Ay#_v1_pods:/registry/pods/a/system%3Anode\n")
        cache = ComponentKeyCache(self.path).load()
        self.assertEqual(cache.keys("kubelet"), {"/registry/pods/a/b"})
        self.assertEqual(cache.keys("x:y"), {"/registry/pods/a/system:node"})
        cache.add("kubelet", PODS, ["/registry/pods/a/c"])
        cache.flush()
        text = self.read()
        self.assertFalse(text.endswith("\n"))
        self.assertEqual(set(yurthub_reader(text)), {"kubelet", "x%3Ay"})
        self.assertEqual(ComponentKeyCache(self.path).load().snapshot(), cache.snapshot())

    def test_a_resource_with_more_keys_than_are_sorted_round_trips(self):
        keys = {f"/registry/endpointslices/ns/svc-{i:06d}" for i in range(SORTED_KEYS_LIMIT + 1)}
        keys.add("/registry/endpointslices/ns/system:x")
        cache = {"leader-yurthub": {SLICES: keys}}
        text = format_lines(cache)
        self.assertEqual(parse_lines(text), cache)
        self.assertIn("system%3Ax", text)
        plain = {"leader-yurthub": {SLICES: keys - {"/registry/endpointslices/ns/system:x"}}}
        self.assertEqual(yurthub_reader(format_lines(plain)), as_yurthub_sees(plain))

    def test_the_text_is_made_in_pieces_of_at_most_keys_per_piece_keys(self):
        # A thread making the text gives the interpreter back between two pieces: no
        # piece may hold a whole 100k-key resource.
        many = {f"/registry/endpointslices/ns/svc-{i:06d}"
                for i in range(SORTED_KEYS_LIMIT + 2 * KEYS_PER_PIECE)}
        sorted_ones = {f"/registry/pods/ns/p-{i:05d}" for i in range(2 * KEYS_PER_PIECE + 1)}
        sorted_ones.add("/registry/pods/ns/system:x")
        cache = {"leader-yurthub": {SLICES: many, PODS: sorted_ones},
                 "kubelet": {PODS: {"/registry/pods/a/b"}}, "empty": {}}
        pieces = list(format_pieces(cache))
        self.assertEqual("".join(pieces), format_lines(cache))
        self.assertLessEqual(max(piece.count(",") for piece in pieces), KEYS_PER_PIECE)
        self.assertGreaterEqual(len(pieces), (len(many) + len(sorted_ones)) // KEYS_PER_PIECE)
        text = format_lines(cache)
        self.assertEqual(parse_lines(text), cache)
        self.assertIn("system%3Ax", text)
        plain = {"leader-yurthub": {SLICES: many}, "kubelet": {PODS: {"/registry/pods/a/b"}}}
        self.assertEqual(yurthub_reader(format_lines(plain)), as_yurthub_sees(plain))
