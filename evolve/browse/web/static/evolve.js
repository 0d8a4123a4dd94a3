// evolve browse: live updates (poll a version token, swap the page body) and lineage scrolling.
document.addEventListener("DOMContentLoaded", function () {
  "use strict";
  var main = document.getElementById("evolve-main");
  var badge = document.getElementById("live-status");
  if (!main) { return; }
  var version = main.dataset.version;
  var busy = false;

  function centreFocus() {
    document.querySelectorAll(".graph-scroll").forEach(function (box) {
      var focus = box.querySelector("a.focus circle");
      if (!focus) { return; }
      var x = parseFloat(focus.getAttribute("cx"));
      box.scrollLeft = Math.max(0, x - box.clientWidth / 2);
    });
  }

  function editing() {
    var active = document.activeElement;
    return active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
  }

  function poll() {
    if (busy || document.hidden || editing()) { return; }
    busy = true;
    fetch(main.dataset.probe || "/-/evolve/version.json", { cache: "no-store" })
      .then(function (r) { return r.json(); })
      .then(function (data) {
        if (data.version === version) { return null; }
        return fetch(location.href, { cache: "no-store" }).then(function (r) { return r.text(); });
      })
      .then(function (html) {
        badge.classList.remove("offline");
        if (!html) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("evolve-main");
        if (!fresh) { return; }
        var scroll = Array.prototype.map.call(main.querySelectorAll(".graph-scroll"), function (b) { return b.scrollLeft; });
        main.innerHTML = fresh.innerHTML;
        version = fresh.dataset.version;
        main.dataset.version = version;
        main.querySelectorAll(".graph-scroll").forEach(function (b, i) { if (i < scroll.length) { b.scrollLeft = scroll[i]; } });
        badge.textContent = "live, updated " + new Date().toLocaleTimeString();
      })
      .catch(function () { badge.classList.add("offline"); badge.textContent = "live (server unreachable)"; })
      .then(function () { busy = false; });
  }

  centreFocus();
  window.setInterval(poll, 2000);
});
