// The sandbox control page's script: every settings.refresh_ms it reads page.json and
// puts in place the sections whose HTML changed. The page calls this function with
// its settings.
(function (settings) {
  "use strict";
  var shown = {};
  var stamp = document.getElementById("refresh");
  function refresh() {
    fetch("page.json", {cache: "no-store"}).then(function (response) {
      if (!response.ok) { throw new Error("HTTP " + response.status); }
      return response.json();
    }).then(function (page) {
      Object.keys(page.sections).forEach(function (id) {
        var el = document.getElementById(id);
        if (el && shown[id] !== page.sections[id]) {
          el.innerHTML = page.sections[id];
          shown[id] = page.sections[id];
          if (el.tagName === "UL") { el.hidden = page.sections[id] === ""; }
        }
      });
      stamp.textContent = "updated " + new Date().toLocaleTimeString();
      stamp.className = "";
    }).catch(function (error) {
      stamp.textContent = "not updated: " + error.message;
      stamp.className = "stale";
    });
  }
  setInterval(refresh, settings.refresh_ms);
})
