// tracemem viewer: the little that needs a script. Runs page: new runs appear while an agent writes.
// The page asks /api/runs/changes with the file version it was rendered from; the server answers from
// a stat() alone until the file changes, then the table body is fetched again.
"use strict";
(function () {
  const live = document.getElementById("live");
  if (!live || live.dataset.poll !== "1") return;
  const every = 2000;
  let version = live.dataset.version;
  let runs = live.dataset.runs;
  const query = live.dataset.query;
  async function poll() {
    try {
      const sep = query ? "&" : "";
      const res = await fetch(`/api/runs/changes?${query}${sep}v=${encodeURIComponent(version)}`);
      if (res.ok) {
        const data = await res.json();
        if (data.changed) {
          version = data.version;
          if (data.runs !== runs) {
            const rows = await fetch(`/runs/rows?${query}`);
            if (rows.ok) {
              const before = new Set([...document.querySelectorAll("#runs-body tr[data-run]")].map(r => r.dataset.run));
              document.getElementById("runs-body").innerHTML = await rows.text();
              for (const tr of document.querySelectorAll("#runs-body tr[data-run]")) {
                if (!before.has(tr.dataset.run)) tr.classList.add("new");
              }
              const total = document.getElementById("runs-total");
              const count = data.runs.split("|")[0];
              if (total && count) total.textContent = count;
              runs = data.runs;
              live.textContent = "updated " + new Date().toLocaleTimeString();
            }
          }
        }
        live.classList.remove("offline");
      }
    } catch (err) {
      live.classList.add("offline");
      live.textContent = "viewer not reachable";
    }
    setTimeout(poll, every);
  }
  live.textContent = "live";
  setTimeout(poll, every);
})();
