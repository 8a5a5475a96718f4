// Kiln dashboard: keep the page's fragments current without a reload.
// Each element with data-fragment="NAME" is re-fetched from /fragments/NAME
// every second and whenever an event arrives on /events/stream.
(function () {
  "use strict";
  var targets = (document.body.dataset.refresh || "").split(" ").filter(Boolean);
  var pending = false;

  function refresh() {
    if (pending) { return; }
    pending = true;
    Promise.all(targets.map(function (name) {
      var el = document.querySelector('[data-fragment="' + name + '"]');
      if (!el) { return null; }
      return fetch("/fragments/" + name, {credentials: "same-origin"})
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null) { el.innerHTML = html; } });
    })).catch(function () {}).then(function () { pending = false; });
  }

  function addEvent(e) {
    var rows = document.getElementById("event-rows");
    if (!rows) { return; }
    var tr = document.createElement("tr");
    tr.dataset.seq = e.seq;
    [new Date(e.at * 1000).toLocaleTimeString(), e.kind, e.node || e.allocation, e.reason]
      .forEach(function (text) {
        var td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      });
    rows.insertBefore(tr, rows.firstChild);
    while (rows.children.length > 200) { rows.removeChild(rows.lastChild); }
  }

  if (targets.length) { setInterval(refresh, 1000); }
  if (window.EventSource) {
    var source = new EventSource("/events/stream");
    source.onmessage = function (message) {
      addEvent(JSON.parse(message.data));
      if (targets.length) { refresh(); }
    };
  }
})();
