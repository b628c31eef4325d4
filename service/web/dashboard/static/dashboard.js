// Progressive enhancement: draw uPlot charts from the application/json blocks the server rendered.
// Pages stay readable without this file; every value is also in a server-rendered table.
(function () {
  "use strict";
  var COLORS = { baseline: "#1f5fbf", resumed: "#d9480f", delta: "#b42318", band: "rgba(26,127,55,0.30)",
                 tol: "#1a7f37", mismatch: "#b42318", save: "#5d6675", diverge: "#b42318", beyond: "#d97706",
                 pass: "#1a7f37", fail: "#b42318", error: "#b7791f", worst: "#8892a6" };
  var charts = (window.parityCharts = {});

  function sci(digits) {
    return function (u, v) { return v == null ? "—" : Number(v).toExponential(digits); };
  }
  function prec(digits) {
    return function (u, v) { return v == null ? "—" : Number(v).toPrecision(digits); };
  }
  function decades(u, splits) {
    // only powers of ten get a tick, a grid line and a label; thin them to about six
    var keep = splits.filter(function (v) { var e = Math.log10(v); return Math.abs(e - Math.round(e)) < 1e-6; });
    var every = Math.max(1, Math.ceil(keep.length / 6));
    return splits.map(function (v) {
      var i = keep.indexOf(v);
      return i >= 0 && i % every === 0 ? v : null;  // anchored at the bottom, where "0" sits
    });
  }
  function logTicks(floor) {
    // exact zeros are plotted on the floor, so the floor (and only the floor) is labelled "0"
    return function (u, splits) {
      return splits.map(function (v) {
        if (v == null) return null;
        return Math.abs(v - floor) <= floor * 1e-4 ? "0" : "1e" + Math.round(Math.log10(v));
      });
    };
  }
  function logRange(floor, series) {
    // a range that fits the data: from the floor (exact zeros) to the decade above the largest value,
    // at least two decades tall so a bit-exact run still gets real labels above its "0"
    var top = floor;
    series.forEach(function (s) { (s || []).forEach(function (v) { if (v != null && v > top) top = v; }); });
    var lo = Math.log10(floor), hi = Math.max(Math.ceil(Math.log10(top) + 1e-9), lo + 2);
    return function () { return [floor, Math.pow(10, hi)]; };
  }
  // steps are whole numbers: tick increments of 1, 2, 5, 10, … never 0.5
  var STEP_AXIS = { label: "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000],
                    values: function (u, splits) { return splits.map(function (v) { return v == null ? null : String(Math.round(v)); }); } };
  function lastIndex(data) {
    // the last x whose series have a value: the legend shows it while no cursor is over the chart
    for (var i = data[0].length - 1; i >= 0; i--) {
      for (var s = 1; s < data.length; s++) if (data[s][i] != null) return i;
    }
    return data[0].length - 1;
  }
  function restingLegend(data) {
    var idx = lastIndex(data);
    var rest = function (u) { if (u.cursor.idx == null) u.setLegend({ idx: idx }); };
    return { hooks: { ready: [rest], setCursor: [rest] } };
  }
  function line(label, color, value, extra) {
    var s = { label: label, stroke: color, width: 1.6, spanGaps: false, value: value, points: { show: false } };
    return Object.assign(s, extra || {});
  }
  function dots(label, color, value) {
    return { label: label, stroke: color, fill: color, value: value, paths: function () { return null; },
             points: { show: true, size: 8, stroke: color, fill: color } };
  }
  function markers(list) {
    return { hooks: { draw: [function (u) {
      var ctx = u.ctx, px = uPlot.pxRatio, box = u.bbox;
      ctx.save();
      list.forEach(function (m, i) {
        var x = Math.round(u.valToPos(m.step, "x", true));
        if (x < box.left || x > box.left + box.width) return;
        ctx.strokeStyle = ctx.fillStyle = COLORS[m.kind] || "#000";
        ctx.lineWidth = 1.5 * px;
        ctx.setLineDash(m.kind === "save" ? [5 * px, 4 * px] : []);
        ctx.beginPath(); ctx.moveTo(x, box.top); ctx.lineTo(x, box.top + box.height); ctx.stroke();
        ctx.font = 11 * px + "px sans-serif";
        ctx.fillText(m.label, x + 4 * px, box.top + (12 + 13 * i) * px);
      });
      ctx.restore();
    }] } };
  }
  function base(el, extra) {
    return Object.assign({ width: Math.max(320, el.clientWidth), height: 260, legend: { live: true },
                           cursor: { drag: { x: true, y: false } } }, extra);
  }
  var BUILD = {
    loss: function (d, el) {
      return [base(el, { scales: { x: { time: false } }, plugins: [markers(d.markers)],
        axes: [STEP_AXIS, { label: "loss", size: 70 }],
        series: [{ label: "step" }, line("uninterrupted", COLORS.baseline, prec(8)),
                 line("resumed", COLORS.resumed, prec(8), { dash: [6, 3] })] }),
        [d.steps, d.loss_baseline, d.loss_resumed]];
    },
    delta: function (d, el) {
      var bottom = function (u) { return u.scales.y.min; };
      return [base(el, { scales: { x: { time: false },
                                   y: { distr: 3, log: 10, range: logRange(d.floor, [d.abs_delta, d.tolerance]) } },
        plugins: [markers(d.delta_markers || d.markers)],
        axes: [STEP_AXIS, { label: "|Δloss|", size: 70, filter: decades, grid: { filter: decades },
                                  ticks: { filter: decades }, values: logTicks(d.floor) }],
        series: [{ label: "step" },
                 line("tolerance", COLORS.tol, sci(2), { fill: COLORS.band, fillTo: bottom, width: 1 }),
                 line("|Δloss|", COLORS.delta, sci(3), { points: { show: true, size: 4 } })] }),
        [d.steps, d.tolerance, d.abs_delta]];
    },
    lr: function (d, el) {
      return [base(el, { scales: { x: { time: false } }, plugins: [markers(d.lr_markers || d.markers)],
        axes: [STEP_AXIS, { label: "learning rate", size: 80, values: function (u, s) {
          return s.map(function (v) { return Number(v).toExponential(1); }); } }],
        series: [{ label: "step" }, line("uninterrupted", COLORS.baseline, sci(6)),
                 line("resumed", COLORS.resumed, sci(6), { dash: [6, 3] }),
                 dots("lr mismatch", COLORS.mismatch, sci(6))] }),
        [d.steps, d.lr_baseline, d.lr_resumed, d.lr_mismatch]];
    },
    history: function (d, el) {
      return [base(el, { scales: { y: { distr: 3, log: 10, range: logRange(d.floor, [d.worst]) } },
        axes: [{}, { label: "worst |Δloss|", size: 70, filter: decades, grid: { filter: decades },
                                  ticks: { filter: decades }, values: logTicks(d.floor) }],
        series: [{ label: "finished" }, line("worst |Δloss|", COLORS.worst, sci(3), { spanGaps: true, width: 1 }),
                 dots("pass", COLORS.pass, sci(3)), dots("fail", COLORS.fail, sci(3)),
                 dots("error", COLORS.error, sci(3))] }),
        [d.x, d.worst, d.pass, d.fail, d.error]];
    }
  };

  function draw(el) {
    var source = document.getElementById(el.dataset.source);
    var build = BUILD[el.dataset.chart];
    if (!source || !build) return;
    var built = build(JSON.parse(source.textContent), el);
    if (!built[1][0].length) return;  // nothing to plot: keep the server's text
    built[0].plugins = (built[0].plugins || []).concat([restingLegend(built[1])]);
    var u = new uPlot(built[0], built[1], el);
    charts[el.id] = u;
    el.dataset.points = String(u.data[0].length);
    el.classList.add("rendered");
  }

  document.querySelectorAll("[data-chart]").forEach(draw);
  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (id) {
      var el = document.getElementById(id);
      charts[id].setSize({ width: Math.max(320, el.clientWidth), height: 260 });
    });
  });
})();

// "Copy as issue" (and any [data-copy] button): copy the named textarea's text to the clipboard.
(function () {
  "use strict";
  document.querySelectorAll("[data-copy]").forEach(function (button) {
    button.addEventListener("click", function () {
      var source = document.getElementById(button.dataset.copy);
      if (!source) return;
      var done = function () { button.textContent = "Copied"; button.dataset.copied = "1"; };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(source.value).then(done, function () { source.select(); });
      } else {
        source.select();
        if (document.execCommand("copy")) done();
      }
    });
  });
})();
