// Appended to a copy of report.html by report_browser.rs and run by headless
// Chromium: measures what the browser laid out and writes it as JSON into
// a pre element (id layout-check), which --dump-dom prints.
(function () {
  const out = { width: window.innerWidth, figures: [] };
  const inside = (r, f) =>
    r.left >= f.left - 0.5 && r.right <= f.right + 0.5 &&
    r.top >= f.top - 0.5 && r.bottom <= f.bottom + 0.5;
  const overlap = (a, b) => {
    const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
    const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    return w > 0.5 && h > 0.5 ? w * h : 0;
  };
  const box = (r) => [r.left, r.top, r.right, r.bottom].map((v) => Math.round(v * 10) / 10);
  for (const fig of document.querySelectorAll("figure.chart")) {
    const f = fig.getBoundingClientRect();
    const texts = [];
    // Text drawn in the plots.
    for (const t of fig.querySelectorAll("svg text")) {
      const r = t.getBoundingClientRect();
      if (r.width > 0 && r.height > 0) texts.push({ s: t.textContent, r, node: t });
    }
    // Every other text: the rectangles of its laid-out lines.
    const walk = document.createTreeWalker(fig, NodeFilter.SHOW_TEXT);
    while (walk.nextNode()) {
      const n = walk.currentNode;
      if (!n.textContent.trim() || n.parentElement.closest("svg")) continue;
      const range = document.createRange();
      range.selectNodeContents(n);
      for (const r of range.getClientRects()) {
        if (r.width > 0 && r.height > 0) texts.push({ s: n.textContent, r, node: n });
      }
    }
    const problems = [];
    for (const t of texts) {
      // A text in a plot must stay inside that plot's SVG (which would clip
      // it), every other text inside the chart.
      const svg = t.node.ownerSVGElement || (t.node.parentElement && t.node.parentElement.closest("svg"));
      const outer = svg ? svg.getBoundingClientRect() : f;
      if (!inside(t.r, outer)) problems.push(`"${t.s}" ${box(t.r)} outside its ${svg ? "plot" : "chart"} ${box(outer)}`);
    }
    for (let i = 0; i < texts.length; i++) {
      for (let j = i + 1; j < texts.length; j++) {
        if (texts[i].node === texts[j].node) continue;
        const a = overlap(texts[i].r, texts[j].r);
        if (a > 1) problems.push(`"${texts[i].s}" ${box(texts[i].r)} overlaps "${texts[j].s}" ${box(texts[j].r)}`);
      }
    }
    // Where the x axis ends, in its own units: from the rendered positions
    // of the first and last tick labels and the plot's right edge.
    let xEnd = null;
    const ticks = [...fig.querySelectorAll("svg text.tick.x")];
    const plot = fig.querySelector(".plot-area");
    if (ticks.length >= 2 && plot) {
      const c = (t) => { const r = t.getBoundingClientRect(); return (r.left + r.right) / 2; };
      const [a, b] = [ticks[0], ticks[ticks.length - 1]];
      const [va, vb] = [parseFloat(a.textContent), parseFloat(b.textContent)];
      const perPx = (vb - va) / (c(b) - c(a));
      xEnd = va + (plot.getBoundingClientRect().right - c(a)) * perPx;
    }
    out.figures.push({
      kind: fig.classList[1] || "",
      scenario: fig.dataset.scenario || "",
      texts: texts.length,
      legend: [...fig.querySelectorAll(".legend .name")].map((e) => e.textContent),
      bars: [...fig.querySelectorAll(".grid > .name")].map((e) => e.textContent),
      drawn_bars: fig.querySelectorAll(".grid .bar").length,
      lines: fig.querySelectorAll("svg polyline").length,
      x_end: xEnd,
      problems,
    });
  }
  const pre = document.createElement("pre");
  pre.id = "layout-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
