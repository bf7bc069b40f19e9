// Search for the site opened from disk (site/index.html, a file:// URL), where the theme's
// search cannot run: browsers refuse it a web worker and the fetch of its index there.
// scripts/mkdocs_hooks.py writes the same index as search/search_index.js (one variable,
// __index), which a <script> tag may load from disk; this searches it on the page itself and
// fills the theme's result list. Served over http, the theme's own search runs instead.
// "?q=words" in the address opens the search with those words (as the theme's does).
(function () {
  "use strict";
  if (location.protocol !== "file:") return;
  var config = JSON.parse(document.getElementById("__config").textContent);
  var base = config.base.replace(/\/$/, "");

  function escape(text) {
    return text.replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }

  function plain(html) {
    var div = document.createElement("div");
    div.innerHTML = html;
    return div.textContent || "";
  }

  // Every word must appear in the title or the text; a word in the title counts most.
  function search(docs, query) {
    var words = query.toLowerCase().split(/\s+/).filter(Boolean);
    if (!words.length) return [];
    var hits = [];
    docs.forEach(function (doc) {
      var title = plain(doc.title).toLowerCase();
      var text = plain(doc.text).toLowerCase();
      var score = 0;
      for (var i = 0; i < words.length; i++) {
        var inTitle = title.indexOf(words[i]) >= 0;
        var at = text.indexOf(words[i]);
        if (!inTitle && at < 0) return;
        score += (inTitle ? 10 : 0) + (at >= 0 ? 1 : 0);
      }
      hits.push({ doc: doc, score: score, text: plain(doc.text), at: text.indexOf(words[0]) });
    });
    hits.sort(function (a, b) { return b.score - a.score; });
    return hits.slice(0, 30);
  }

  function show(hits, query) {
    var meta = document.querySelector(".md-search-result__meta");
    var list = document.querySelector(".md-search-result__list");
    if (!meta || !list) return;
    var t = config.translations;
    meta.textContent = !query ? t["search.result.placeholder"]
      : hits.length === 0 ? t["search.result.none"]
      : hits.length === 1 ? t["search.result.one"]
      : t["search.result.other"].replace("#", hits.length);
    list.innerHTML = hits.map(function (hit) {
      var start = Math.max(0, hit.at - 60);
      var snippet = hit.text.slice(start, start + 200);
      return '<li class="md-search-result__item"><a class="md-search-result__link" href="' +
        base + "/" + hit.doc.location + '"><article class="md-search-result__article ' +
        'md-typeset"><h1>' + escape(plain(hit.doc.title)) + "</h1><p>" +
        escape((start > 0 ? "... " : "") + snippet) + "</p></article></a></li>";
    }).join("");
  }

  function start() {
    var docs = window.__index.docs;
    var input = document.querySelector(".md-search__input");
    var toggle = document.getElementById("__search");
    if (!input) return;
    // The theme hides its search dialog on a file:// page; this search makes it work there.
    var dialog = document.querySelector('[data-md-component="search"]');
    var unhide = function () { if (dialog && dialog.hidden) dialog.hidden = false; };
    unhide();
    if (dialog) new MutationObserver(unhide).observe(dialog, { attributes: true });
    input.disabled = false;
    var run = function () { show(search(docs, input.value), input.value); };
    input.addEventListener("input", run);
    input.addEventListener("focus", function () { if (toggle) toggle.checked = true; });
    var q = new URLSearchParams(location.search).get("q");
    if (q) {
      input.value = q;
      if (toggle) toggle.checked = true;
      run();
    }
  }

  var script = document.createElement("script");
  script.src = base + "/search/search_index.js";
  script.onload = start;
  document.head.appendChild(script);
})();
