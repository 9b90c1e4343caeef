package main

// Code interpreter rows: what a data-analysis agent waits for before its
// first result, through the E2B API the unmodified SDKs speak, against
// running the same Python import with runsc directly.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/server"
	"github.com/spacesandbox/space/internal/template"
)

var interpSamples = flag.Int("interpreter", 8, "samples per code-interpreter row (0 skips; builds the python-data template when it is not cached)")

// interpCell is the first cell the rows time: the import data-analysis
// code starts with, answering its version.
const interpCell = "import pandas as pd\npd.__version__"

// interpreterRows runs a server with the E2B API and a python-data pool of
// one (whose sandboxes wait with the default kernel prestarted), and times,
// interleaved: an E2B create of code-interpreter-v1 plus the first cell;
// the first cell alone in it; and the first cell in a sandbox claimed from
// the same pool through space's own API (which ends the prestarted kernel,
// so the cell starts one: what every first cell cost before prestarting).
func (b *bench) interpreterRows(agent string) error {
	n := *interpSamples
	if n <= 0 {
		return nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	e2bAddr := ln.Addr().String()
	ln.Close()
	s, stop, err := b.serve(server.Config{DataDir: filepath.Join(b.tmp, "interp"), AgentPath: agent, PoolSize: -1, Pools: "python-data=1", E2BListen: e2bAddr})
	if err != nil {
		return err
	}
	defer stop()
	defer s.deleteAll()
	// A cache hit after `make test`; the pool starts once it is ready.
	if code := s.do("POST", "/v1/templates/python-data/build", nil, nil); code != 200 {
		return fmt.Errorf("build python-data: HTTP %d", code)
	}
	var k struct{ Key string }
	if code := s.do("POST", "/v1/keys", map[string]string{"team": "bench", "name": "bench"}, &k); code != 201 {
		return fmt.Errorf("team key: HTTP %d", code)
	}
	e2b := &e2bClient{url: "http://" + e2bAddr, key: k.Key}
	team := &bench{url: s.url, key: k.Key}

	warm := row{name: "code interpreter: E2B create + first cell `import pandas` (pool, kernel prestarted)"}
	cell := row{name: "code interpreter: first cell `import pandas`, kernel prestarted"}
	lazy := row{name: "code interpreter: first cell `import pandas`, kernel started by the cell"}
	for i := 0; i < n; i++ {
		if err := s.waitPoolReady("python-data", 3*time.Minute); err != nil {
			return err
		}
		t0 := time.Now()
		id, token, err := e2b.create()
		if err != nil {
			return err
		}
		t1 := time.Now()
		if err := e2b.execute(id, token, interpCell); err != nil {
			return err
		}
		warm.space, cell.space = append(warm.space, time.Since(t0)), append(cell.space, time.Since(t1))

		if err := s.waitPoolReady("python-data", 3*time.Minute); err != nil {
			return err
		}
		var sb struct{ ID string }
		if code := team.do("POST", "/v1/sandboxes", map[string]any{"template": "python-data", "timeout_s": 600}, &sb); code != 201 {
			return fmt.Errorf("create python-data: HTTP %d", code)
		}
		id = strings.TrimPrefix(sb.ID, "sb-")
		if token, err = e2b.connect(id); err != nil {
			return err
		}
		t1 = time.Now()
		if err := e2b.execute(id, token, interpCell); err != nil {
			return err
		}
		lazy.space = append(lazy.space, time.Since(t1))
		s.deleteAll()
	}

	// Raw: the same import in a fresh runsc sandbox of the same rootfs.
	tb, err := template.NewBuilder(filepath.Join(b.cache, "templates"))
	if err != nil {
		return err
	}
	recipe, err := template.Builtin("python-data")
	if err != nil {
		return err
	}
	py, err := tb.Build(context.Background(), recipe, func(string) {})
	if err != nil {
		return err
	}
	raw := &rawRunsc{runsc: b.runsc, root: filepath.Join(b.tmp, "raw-root-py"), rootfs: py.Path, dir: filepath.Join(b.tmp, "raw-py")}
	rawName := "runsc run python3 -c 'import pandas' → exit"
	for i := 0; i < n; i++ {
		d, err := raw.runPython(fmt.Sprintf("rawpy%d", i), "import pandas as pd; print(pd.__version__)")
		if err != nil {
			return err
		}
		warm.raw = append(warm.raw, d)
	}
	for _, r := range []*row{&warm, &cell, &lazy} {
		r.rawName, r.raw = rawName, warm.raw
		b.rows = append(b.rows, *r)
	}
	b.notes = append(b.notes, "Code interpreter rows: a server with `--e2b-listen` and `--pools python-data=1`, whose sandboxes wait with the code interpreter's default Python kernel running and numpy, pandas and matplotlib.pyplot imported; the cell goes to the E2B `/execute` endpoint as the SDK sends it. The \"started by the cell\" row claims from the same pool through space's own API, which ends the prestarted kernel, so the E2B cell starts one, as every first cell did before kernels were prestarted. Samples interleave and each waits for the pool to refill.")
	return nil
}

// waitPoolReady waits until template's pool has a warm sandbox.
func (b *bench) waitPoolReady(template string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		var ps struct {
			Pools []struct {
				Template string
				Ready    int
			}
		}
		b.do("GET", "/v1/pools", nil, &ps)
		for _, p := range ps.Pools {
			if p.Template == template && p.Ready > 0 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the %s pool did not refill within %s", template, limit)
}

// e2bClient speaks the E2B API as the SDKs do (control plane and code
// interpreter on one address, routed by headers).
type e2bClient struct{ url, key string }

func (c *e2bClient) post(path string, body any, hdr http.Header) (*http.Response, error) {
	j, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", c.url+path, bytes.NewReader(j))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header[k] = v
	}
	return apiClient.Do(req)
}

func (c *e2bClient) create() (id, token string, err error) {
	resp, err := c.post("/sandboxes", map[string]any{"templateID": "code-interpreter-v1", "timeout": 600}, http.Header{"X-Api-Key": {c.key}})
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	var v struct {
		ID    string `json:"sandboxID"`
		Token string `json:"envdAccessToken"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != 201 || v.ID == "" {
		return "", "", fmt.Errorf("e2b create: HTTP %d %v", resp.StatusCode, err)
	}
	return v.ID, v.Token, nil
}

func (c *e2bClient) connect(id string) (string, error) {
	resp, err := c.post("/sandboxes/"+id+"/connect", map[string]any{"timeout": 600}, http.Header{"X-Api-Key": {c.key}})
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var v struct {
		Token string `json:"envdAccessToken"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || v.Token == "" {
		return "", fmt.Errorf("e2b connect: HTTP %d %v", resp.StatusCode, err)
	}
	return v.Token, nil
}

// execute runs code in the default Python context and reads the answer to
// its end; a cell that fails or gives no result is an error.
func (c *e2bClient) execute(id, token, code string) error {
	resp, err := c.post("/execute", map[string]string{"code": code},
		http.Header{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"49999"}, "X-Access-Token": {token}})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	result := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m struct {
			Type  string `json:"type"`
			Value string `json:"value"`
		}
		_ = json.Unmarshal(sc.Bytes(), &m)
		switch m.Type {
		case "error":
			return fmt.Errorf("e2b execute: %s", m.Value)
		case "result":
			result = true
		case "end_of_execution":
			if !result {
				return fmt.Errorf("e2b execute: no result")
			}
			return nil
		}
	}
	return fmt.Errorf("e2b execute: HTTP %d, the answer ended early: %v", resp.StatusCode, sc.Err())
}

// runPython times `runsc run python3 -c code` until it exits with output.
func (r *rawRunsc) runPython(id, code string) (time.Duration, error) {
	dir, err := r.bundle(id, []string{"/usr/bin/python3", "-c", code})
	if err != nil {
		return 0, err
	}
	defer r.delete(id)
	t0 := time.Now()
	out, err := exec.Command(r.runsc, append(r.flags(dir), "run", "--bundle", dir, id)...).Output()
	d := time.Since(t0)
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		return 0, fmt.Errorf("runsc run python3: %v %q", err, out)
	}
	return d, nil
}
