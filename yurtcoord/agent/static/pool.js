// The pool page's script: redraws the page from /status, /readyz and /pool every
// settings.refresh_ms. The page calls this function with its settings (the leader
// timeline's span in seconds, its width, height and bar height, the colours its
// leaders get in turn), so the file holds no value of the page's own.
(function (settings) {
  "use strict";
  var SPAN = settings.span, WIDTH = settings.width, HEIGHT = settings.height,
      BAR = settings.bar;
  var COLOURS = settings.colours;
  function show(el, kind, value) {
    if (kind === "cause") {
      var named = value && typeof value.text === "string";
      el.textContent = named ? value.text : "none";
      el.className = "value " + (named ? "no" : "yes");
    } else if (kind === "probed" && (value === null || value === undefined)) {
      el.textContent = "not probed";
      el.className = "value none";
    } else if (kind === "bool" || kind === "probed") {
      el.textContent = value ? "yes" : "no";
      el.className = "value " + (value ? "yes" : "no");
    } else if (value === null || value === undefined) {
      el.textContent = "none";
      el.className = "value none";
    } else {
      el.textContent = String(value);
      el.className = kind === "role" ? "value role-" + String(value) : "value";
    }
  }
  function cell(row, text, className) {
    var td = document.createElement("td");
    td.textContent = text;
    if (className) { td.className = className; }
    row.appendChild(td);
  }
  function render(status) {
    var fields = document.querySelectorAll("[data-field]");
    for (var i = 0; i < fields.length; i++) {
      var el = fields[i];
      show(el, el.getAttribute("data-kind"), status[el.getAttribute("data-field")]);
    }
    document.title = "yurtcoord " + status.node + " \u00b7 " + status.role;
    var body = document.getElementById("cloud-servers");
    while (body.firstChild) { body.removeChild(body.firstChild); }
    var urls = Object.keys(status.cloud || {}).sort();
    for (var j = 0; j < urls.length; j++) {
      var row = document.createElement("tr");
      var healthy = status.cloud[urls[j]];
      cell(row, urls[j]);
      if (healthy === null || healthy === undefined) {
        cell(row, status.servers_not_probed || "not probed", "none");
      } else {
        cell(row, healthy ? "healthy" : "unhealthy", healthy ? "yes" : "no");
      }
      body.appendChild(row);
    }
    if (!urls.length) {
      var empty = document.createElement("tr");
      cell(empty, "no cloud servers", "none");
      body.appendChild(empty);
    }
  }
  function renderReadiness(code, text) {
    var list = document.getElementById("readiness");
    while (list.firstChild) { list.removeChild(list.firstChild); }
    var lines = code === 200 ? ["ready"] : text.split("\n").filter(Boolean).map(
      function (line) { return line.replace(/^not ready: /, ""); });
    for (var i = 0; i < lines.length; i++) {
      var item = document.createElement("li");
      item.textContent = lines[i];
      item.className = code === 200 ? "yes" : "no";
      list.appendChild(item);
    }
  }
  function clear(el) { while (el.firstChild) { el.removeChild(el.firstChild); } }
  function age(value) {
    return typeof value === "number" ? value.toFixed(1) + "s" : "none";
  }
  function serverCell(row, column, url) {
    var known = typeof url === "string" && url !== "";
    var td = document.createElement("td");
    td.setAttribute("data-column", column);
    if (!known) { td.className = "none"; }
    td.textContent = known ? url : "none";
    row.appendChild(td);
  }
  function renderMembers(pool) {
    var body = document.getElementById("members");
    clear(body);
    var members = pool.members || [];
    for (var i = 0; i < members.length; i++) {
      var m = members[i], path = String(m.heartbeat), stale = path === "stale";
      var row = document.createElement("tr");
      row.className = stale ? "stale" : "member";
      row.setAttribute("data-node", String(m.node));
      row.setAttribute("data-heartbeat", path);
      cell(row, String(m.node));
      if (stale) {
        var badge = document.createElement("span");
        badge.className = "badge";
        badge.textContent = "STALE";
        row.firstChild.appendChild(badge);
      }
      cell(row, path, "path-" + path);
      cell(row, age(m.lease_age));
      cell(row, m.leader === true ? "leader" : "", m.leader === true ? "role-leader" : "");
      serverCell(row, "etcd-member", m.etcd_member);
      serverCell(row, "coordinator-server", m.coordinator_server);
      var upload = m.upload;
      cell(row, upload ? (upload.uploaded ? "uploaded (" + upload.objects + ")"
                                          : "not uploaded") : "unknown");
      body.appendChild(row);
    }
    if (!members.length) {
      var empty = document.createElement("tr");
      cell(empty, "no members known yet", "none");
      body.appendChild(empty);
    }
  }
  function segmentsOf(changes, now) {
    var points = [], segments = [];
    for (var i = 0; i < changes.length; i++) {
      if (typeof changes[i].at === "number" && changes[i].leader) {
        points.push([changes[i].at, String(changes[i].leader)]);
      }
    }
    for (var j = 0; j < points.length; j++) {
      var end = j + 1 < points.length ? points[j + 1][0] : now;
      var start = Math.max(points[j][0], now - SPAN);
      end = Math.min(end, now);
      if (end > start) { segments.push([start, end, points[j][1]]); }
    }
    return segments;
  }
  function svgChild(svg, tag, attributes, text) {
    var el = document.createElementNS(svg.namespaceURI, tag);
    for (var name in attributes) { el.setAttribute(name, String(attributes[name])); }
    if (text !== undefined) { el.textContent = text; }
    svg.appendChild(el);
    return el;
  }
  function renderTimeline(pool) {
    var box = document.getElementById("timeline");
    clear(box);
    var segments = segmentsOf(pool.leader_changes || [], pool.generated_at);
    if (!segments.length) {
      var note = document.createElement("p");
      note.className = "muted";
      note.textContent = "no leader change seen by this agent in the last hour";
      box.appendChild(note);
      return;
    }
    var svg = document.getElementById("timeline-svg").content.firstElementChild
      .cloneNode(false);
    var leaders = segments.map(function (s) { return s[2]; }).filter(
      function (name, i, all) { return all.indexOf(name) === i; }).sort();
    var scale = WIDTH / SPAN, origin = pool.generated_at - SPAN;
    for (var i = 0; i < segments.length; i++) {
      var s = segments[i], x = (s[0] - origin) * scale;
      var width = Math.max(3, (s[1] - s[0]) * scale);
      var rect = svgChild(svg, "rect", {x: x.toFixed(1), y: 4, width: width.toFixed(1),
        height: BAR, fill: COLOURS[leaders.indexOf(s[2]) % COLOURS.length],
        "data-leader": s[2]});
      svgChild(rect, "title", {}, s[2] + ": " + new Date(s[0] * 1000).toISOString() +
               " to " + new Date(s[1] * 1000).toISOString());
      if (width > 8 * s[2].length) {
        svgChild(svg, "text", {x: (x + 4).toFixed(1), y: 23, fill: "#fff",
                               "font-size": 12}, s[2]);
      }
    }
    svgChild(svg, "text", {x: 0, y: HEIGHT - 6, "font-size": 11, fill: "#666"},
             "1 hour ago");
    svgChild(svg, "text", {x: WIDTH, y: HEIGHT - 6, "font-size": 11, fill: "#666",
                           "text-anchor": "end"}, "now");
    box.appendChild(svg);
    var legend = document.createElement("p");
    legend.className = "legend";
    for (var j = 0; j < leaders.length; j++) {
      var key = document.createElement("span");
      key.className = "key";
      key.style.background = COLOURS[j % COLOURS.length];
      legend.appendChild(key);
      legend.appendChild(document.createTextNode(leaders[j] + " "));
    }
    box.appendChild(legend);
  }
  function renderCache(pool) {
    var cache = pool.cache || {};
    document.getElementById("sync-age").textContent = age(cache.informer_sync_lease_age);
    document.getElementById("sync-holder").textContent = cache.informer_sync_holder || "none";
    var synced = document.getElementById("sync-synced");
    synced.textContent = cache.synced ? "yes" : "no";
    synced.className = cache.synced ? "yes" : "no";
    var body = document.getElementById("cache-resources");
    clear(body);
    var names = Object.keys(cache.resources || {}).sort();
    for (var i = 0; i < names.length; i++) {
      var row = document.createElement("tr");
      var count = cache.resources[names[i]];
      cell(row, names[i]);
      cell(row, count === null ? "none" : String(count));
      body.appendChild(row);
    }
    var list = document.getElementById("pool-errors");
    clear(list);
    var errors = Object.keys(pool.errors || {}).sort();
    for (var j = 0; j < errors.length; j++) {
      var item = document.createElement("li");
      item.className = "no";
      item.textContent = errors[j] + ": " + pool.errors[errors[j]];
      list.appendChild(item);
    }
    list.hidden = !errors.length;
  }
  function renderPool(pool) {
    renderMembers(pool);
    renderTimeline(pool);
    renderCache(pool);
  }
  function mark(text, stale) {
    var el = document.getElementById("refresh");
    el.textContent = text;
    el.className = stale ? "stale" : "";
  }
  function refresh() {
    var status = fetch("status", {cache: "no-store"}).then(function (response) {
      if (!response.ok) { throw new Error("/status answered " + response.status); }
      return response.json();
    });
    var readiness = fetch("readyz", {cache: "no-store"}).then(function (response) {
      return response.text().then(function (text) { return [response.status, text]; });
    });
    var pool = fetch("pool", {cache: "no-store"}).then(function (response) {
      return response.ok ? response.json() : null;
    }).catch(function () { return null; });
    Promise.all([status, readiness, pool]).then(function (results) {
      var pool = results[2];
      render(results[0]);
      renderReadiness(results[1][0], results[1][1]);
      if (pool) { renderPool(pool); }
      mark("live, updated " + new Date().toLocaleTimeString(), false);
    }).catch(function (error) {
      mark("cannot reach this agent (" + error.message + "); showing the last answer", true);
    });
  }
  refresh();
  setInterval(refresh, settings.refresh_ms);
})
