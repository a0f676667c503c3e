-- wrk script of benchmarks/run.py.
--
-- With arguments `-- PREFIX IDS_FILE` every request asks for PREFIX .. <a random line of
-- IDS_FILE> (get by random id); with `-- paths PATHS_FILE`, for a random line of
-- PATHS_FILE (a path and query: a distinct page each time, e.g. random offsets or
-- cursors); without, wrk sends its one static request. Either way the
-- run ends with one machine-readable line, `WRK_JSON {...}`, that run.py parses: counts,
-- and the latency (microseconds) at every half percentile, so that run.py can merge the
-- slices of an interleaved measurement.

function init(args)
  if args[1] == "paths" then
    local paths = {}
    for line in io.lines(args[2]) do
      paths[#paths + 1] = line
    end
    -- Seeded by the clock, so each slice of a measurement asks for other pages than the
    -- slice before it (a fixed seed would replay the pages it has just warmed).
    math.randomseed(os.time() + math.floor(os.clock() * 1e6))
    request = function()
      return wrk.format(nil, paths[math.random(#paths)])
    end
  elseif #args >= 2 then
    local prefix = args[1]
    local ids = {}
    for line in io.lines(args[2]) do
      ids[#ids + 1] = line
    end
    math.randomseed(20240601)
    -- Defined here, so wrk sees a dynamic request only when ids were given.
    request = function()
      return wrk.format(nil, prefix .. ids[math.random(#ids)])
    end
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local grid = {}
  for i = 1, 200 do
    grid[i] = string.format("%d", latency:percentile(i / 2))
  end
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"max_us":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"percentiles":[%s]}\n',
    summary.requests, summary.duration, summary.bytes, latency.max,
    e.connect, e.read, e.write, e.status, e.timeout, table.concat(grid, ",")))
end
