package e2e

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	space "github.com/spacesandbox/space/sdk/go"
)

type quotaView struct {
	Team          string `json:"team"`
	MaxSandboxes  int    `json:"max_sandboxes"`
	MaxMemoryMB   int    `json:"max_memory_mb"`
	MaxCPU        int    `json:"max_cpu"`
	MaxSnapshotMB int    `json:"max_snapshot_mb"`
	MaxRPS        int    `json:"max_rps"`
	MaxDiskMB     int    `json:"max_disk_mb"`
	Source        string `json:"source"`
	Usage         struct {
		Sandboxes  int `json:"sandboxes"`
		MemoryMB   int `json:"memory_mb"`
		CPU        int `json:"cpu"`
		DiskMB     int `json:"disk_mb"`
		SnapshotMB int `json:"snapshot_mb"`
	} `json:"usage"`
}

// TestQuotas: a team's quota holds against concurrent creates, forks and
// paused sandboxes, refuses with 429 quota_exceeded and makes nothing, and
// touches no other team. Only an admin sets quotas; a team reads its own.
func TestQuotas(t *testing.T) {
	s := sharedServer(t)
	key := s.teamKey("quota-a")
	otherKey := s.teamKey("quota-b")
	path := "/v1/teams/quota-a/quota"

	var q quotaView
	if code := s.do("GET", path, key, nil, &q); code != 200 || q.Source != "default" || q.MaxSandboxes != 0 || q.Usage.Sandboxes != 0 {
		t.Fatalf("a team's default quota: %d %+v", code, q)
	}
	var e apiError
	if code := s.do("GET", "/v1/teams/quota-b/quota", key, nil, &e); code != 403 {
		t.Errorf("a team read another team's quota: %d %+v", code, e)
	}
	if code := s.do("PUT", path, key, map[string]int{"max_sandboxes": 100}, &e); code != 403 {
		t.Errorf("a team set its own quota: %d %+v", code, e)
	}
	if code := s.do("PUT", path, s.key, map[string]int{"max_sandboxes": 2}, &q); code != 200 || q.Source != "team" || q.MaxSandboxes != 2 || q.MaxMemoryMB != 0 {
		t.Fatalf("admin sets a quota: %d %+v", code, q)
	}

	// Four creates at once against a limit of two: two made, two refused.
	var (
		mu      sync.Mutex
		made    []string
		refused []apiError
		wg      sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			var out struct {
				ID string `json:"id"`
				apiError
			}
			code := s.do("POST", "/v1/sandboxes", key, map[string]any{}, &out)
			mu.Lock()
			defer mu.Unlock()
			switch code {
			case 201:
				made = append(made, out.ID)
			case 429:
				refused = append(refused, out.apiError)
			default:
				t.Errorf("create under a quota: %d %+v", code, out)
			}
		})
	}
	wg.Wait()
	if len(made) != 2 || len(refused) != 2 {
		t.Fatalf("4 creates with room for 2: %d made, %d refused", len(made), len(refused))
	}
	if r := refused[0]; r.Code != 429 || r.Error != "quota_exceeded" || !strings.Contains(r.Message, "2 sandboxes") {
		t.Errorf("refusal: %+v", r)
	}
	t.Logf("refused: %s", refused[0].Message)
	s.do("GET", path, key, nil, &q)
	if q.Usage.Sandboxes != 2 || q.Usage.MemoryMB != 1024 {
		t.Errorf("usage after two creates: %+v", q.Usage)
	}
	var list struct{ Sandboxes []sandboxView }
	s.do("GET", "/v1/sandboxes", key, nil, &list)
	if len(list.Sandboxes) != 2 {
		t.Errorf("the team lists %d sandboxes, want the 2 made", len(list.Sandboxes))
	}

	// A fork would make a third; another team is not affected.
	if code := s.do("POST", "/v1/sandboxes/"+made[0]+"/fork", key, map[string]int{"count": 1}, &e); code != 429 || e.Error != "quota_exceeded" {
		t.Errorf("fork past the quota: %d %+v", code, e)
	}
	var sb sandboxView
	if code := s.do("POST", "/v1/sandboxes", otherKey, map[string]any{}, &sb); code != 201 {
		t.Fatalf("another team's create: %d", code)
	}
	s.do("DELETE", "/v1/sandboxes/"+sb.ID, otherKey, nil, nil)

	// A paused sandbox still counts (it holds its memory); a stopped one
	// does not.
	if code := s.do("POST", "/v1/sandboxes/"+made[0]+"/pause", key, nil, &sb); code != 200 {
		t.Fatalf("pause: %d", code)
	}
	if code := s.do("POST", "/v1/sandboxes", key, map[string]any{}, &e); code != 429 {
		t.Errorf("create with one running and one paused of 2: %d", code)
	}
	if code := s.do("DELETE", "/v1/sandboxes/"+made[0], key, nil, nil); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	if code := s.do("POST", "/v1/sandboxes", key, map[string]any{}, &sb); code != 201 {
		t.Fatalf("create after a delete freed a place: %d", code)
	}
	made = []string{made[1], sb.ID}

	// The memory limit: 1024 MiB held of 1536; 512 more fit, 1024 do not.
	if code := s.do("PUT", path, s.key, map[string]int{"max_memory_mb": 1536}, &q); code != 200 || q.MaxSandboxes != 0 || q.MaxMemoryMB != 1536 {
		t.Fatalf("memory quota: %d %+v", code, q)
	}
	if code := s.do("POST", "/v1/sandboxes", key, map[string]any{"memory_mb": 1024}, &e); code != 429 || !strings.Contains(e.Message, "MiB") {
		t.Errorf("create past the memory quota: %d %+v", code, e)
	}
	if code := s.do("POST", "/v1/sandboxes", key, map[string]any{}, &sb); code != 201 {
		t.Fatalf("create within the memory quota: %d", code)
	}
	made = append(made, sb.ID)

	// The CPU limit: 3 sandboxes of 1 CPU held of 4; 2 more do not fit, 1
	// does, and then a fork does not.
	if code := s.do("PUT", path, s.key, map[string]int{"max_cpu": -1}, &e); code != 400 || !strings.Contains(e.Message, "max_cpu") {
		t.Errorf("a negative CPU quota: %d %+v", code, e)
	}
	if code := s.do("PUT", path, s.key, map[string]int{"max_cpu": 4}, &q); code != 200 || q.MaxCPU != 4 || q.MaxMemoryMB != 0 || q.Usage.CPU != 3 {
		t.Fatalf("CPU quota: %d %+v", code, q)
	}
	if code := s.do("POST", "/v1/sandboxes", key, map[string]any{"cpu": 2}, &e); code != 429 || !strings.Contains(e.Message, "3 of its 4 CPUs") {
		t.Errorf("create past the CPU quota: %d %+v", code, e)
	}
	if code := s.do("POST", "/v1/sandboxes", key, map[string]any{"cpu": 1}, &sb); code != 201 {
		t.Fatalf("create within the CPU quota: %d", code)
	}
	made = append(made, sb.ID)
	if code := s.do("POST", "/v1/sandboxes/"+sb.ID+"/fork", key, map[string]int{"count": 1}, &e); code != 429 || !strings.Contains(e.Message, "CPUs") {
		t.Errorf("fork past the CPU quota: %d %+v", code, e)
	}

	// Back to the server's default (no limit here).
	if code := s.do("DELETE", path, s.key, nil, nil); code != 204 {
		t.Fatalf("delete quota: %d", code)
	}
	if code := s.do("DELETE", path, s.key, nil, &e); code != 404 {
		t.Errorf("delete a quota twice: %d", code)
	}
	if code := s.do("POST", "/v1/sandboxes", key, map[string]any{}, &sb); code != 201 {
		t.Fatalf("create without a quota: %d", code)
	}
	made = append(made, sb.ID)
	for _, id := range made {
		s.do("DELETE", "/v1/sandboxes/"+id, key, nil, nil)
	}
}

// TestHostReserve: below the host's memory reserve a server refuses new
// sandboxes with a clear 503 and its pool does not boot more.
func TestHostReserve(t *testing.T) {
	// A reserve larger than any host: the server is "full" from the start.
	s := startServer(t, "", "--reserve-memory-mb", "100000000", "--pool-size", "1")
	defer s.stop(true)
	var e apiError
	if code := s.do("POST", "/v1/sandboxes", s.key, map[string]any{}, &e); code != 503 || e.Error != "unavailable" || !strings.Contains(e.Message, "reserve") {
		t.Fatalf("create below the reserve: %d %+v", code, e)
	}
	waitFor(t, "the pool to say it waits", time.Minute, func() bool {
		return strings.Contains(s.logText(), "warm pool: not refilling")
	})
	var list struct{ Sandboxes []sandboxView }
	s.do("GET", "/v1/sandboxes?state=creating,running,paused,stopping,stopped,error", s.key, nil, &list)
	if len(list.Sandboxes) != 0 {
		t.Errorf("sandboxes after refused creates: %+v", list.Sandboxes)
	}
}

// TestSnapshotQuota: a team's snapshot quota counts each distinct chunk of
// its ready snapshots once, refuses the snapshot after the one that
// crossed it with 429, and gives the room back when snapshots are deleted.
func TestSnapshotQuota(t *testing.T) {
	s := sharedServer(t)
	key := s.teamKey("snapq")
	path := "/v1/teams/snapq/quota"
	var q quotaView
	if code := s.do("PUT", path, s.key, map[string]int{"max_snapshot_mb": 8}, &q); code != 200 || q.MaxSnapshotMB != 8 || q.Usage.SnapshotMB != 0 {
		t.Fatalf("set a snapshot quota: %d %+v", code, q)
	}
	defer s.do("DELETE", path, s.key, nil, nil)
	var sb sandboxView
	if code := s.do("POST", "/v1/sandboxes", key, map[string]any{}, &sb); code != 201 {
		t.Fatalf("create: %d", code)
	}
	defer s.do("DELETE", "/v1/sandboxes/"+sb.ID, key, nil, nil)
	run := func(cmd string) {
		t.Helper()
		var res struct {
			ExitCode int    `json:"exit_code"`
			Stderr   string `json:"stderr"`
		}
		if code := s.do("POST", "/v1/sandboxes/"+sb.ID+"/exec", key, map[string]any{"cmd": cmd}, &res); code != 200 || res.ExitCode != 0 {
			t.Fatalf("%s: %d %+v", cmd, code, res)
		}
	}
	type snap struct {
		ID string `json:"id"`
		apiError
	}
	take := func(want int) snap {
		t.Helper()
		var sn snap
		if code := s.do("POST", "/v1/sandboxes/"+sb.ID+"/snapshots", key, map[string]string{"kind": "files"}, &sn); code != want {
			t.Fatalf("snapshot: %d %+v, want %d", code, sn, want)
		}
		return sn
	}
	usage := func() int {
		t.Helper()
		s.do("GET", path, key, nil, &q)
		return q.Usage.SnapshotMB
	}

	run("head -c 3145728 /dev/urandom > a")
	take(201)
	u1 := usage()
	if u1 < 3 || u1 > 5 {
		t.Fatalf("usage after a 3 MiB file: %d MiB", u1)
	}
	take(201) // the same data again: counted once
	if u := usage(); u != u1 {
		t.Errorf("usage after an unchanged snapshot: %d MiB, want %d", u, u1)
	}
	run("head -c 6291456 /dev/urandom > b")
	third := take(201) // taken while under the quota, so kept whole
	if u := usage(); u < u1+6 {
		t.Errorf("usage after 6 MiB more: %d MiB", u)
	}
	refused := take(429)
	if refused.Error != "quota_exceeded" || !strings.Contains(refused.Message, "8 MiB") {
		t.Errorf("refusal: %+v", refused)
	}
	t.Logf("refused: %s", refused.Message)
	var list struct{ Snapshots []struct{ ID string } }
	s.do("GET", "/v1/sandboxes/"+sb.ID+"/snapshots", key, nil, &list)
	if len(list.Snapshots) != 3 {
		t.Errorf("timeline after a refusal: %+v (the refused one must leave nothing)", list)
	}
	// Another team is not limited by this one's quota.
	other := s.teamKey("snapq-other")
	var osb sandboxView
	if code := s.do("POST", "/v1/sandboxes", other, map[string]any{}, &osb); code != 201 {
		t.Fatalf("create: %d", code)
	}
	defer s.do("DELETE", "/v1/sandboxes/"+osb.ID, other, nil, nil)
	if code := s.do("POST", "/v1/sandboxes/"+osb.ID+"/snapshots", other, map[string]string{"kind": "files"}, nil); code != 201 {
		t.Errorf("another team's snapshot: %d", code)
	}
	// Deleting the snapshot that held b gives its room back.
	if code := s.do("DELETE", "/v1/snapshots/"+third.ID, key, nil, nil); code != 204 {
		t.Fatalf("delete snapshot: %d", code)
	}
	if u := usage(); u != u1 {
		t.Errorf("usage after deleting the third snapshot: %d MiB, want %d", u, u1)
	}
	take(201)
}

// TestDiskReserve: below the disk reserve a server refuses new sandboxes
// and snapshots with 507 insufficient_storage, leaves running sandboxes
// alone, and its pool does not boot more.
func TestDiskReserve(t *testing.T) {
	s := startServer(t, "", "--pool-size", "-1")
	var sb sandboxView
	if code := s.do("POST", "/v1/sandboxes", s.key, map[string]any{}, &sb); code != 201 {
		t.Fatalf("create: %d", code)
	}
	// Restart with a reserve larger than any disk.
	s.stop(false)
	s.extra = []string{"--reserve-disk-mb", "100000000", "--pool-size", "1"}
	s.start()
	var e apiError
	if code := s.do("POST", "/v1/sandboxes", s.key, map[string]any{}, &e); code != 507 || e.Error != "insufficient_storage" || !strings.Contains(e.Message, "reserve") {
		t.Fatalf("create below the disk reserve: %d %+v", code, e)
	}
	if code := s.do("POST", "/v1/sandboxes/"+sb.ID+"/snapshots", s.key, map[string]string{"kind": "files"}, &e); code != 507 || e.Error != "insufficient_storage" {
		t.Errorf("snapshot below the disk reserve: %d %+v", code, e)
	}
	if code := s.do("POST", "/v1/sandboxes/"+sb.ID+"/fork", s.key, map[string]int{"count": 1}, &e); code != 507 {
		t.Errorf("fork below the disk reserve: %d %+v", code, e)
	}
	var res struct {
		ExitCode int `json:"exit_code"`
	}
	if code := s.do("POST", "/v1/sandboxes/"+sb.ID+"/exec", s.key, map[string]any{"cmd": "true"}, &res); code != 200 || res.ExitCode != 0 {
		t.Errorf("the running sandbox stopped answering: %d", code)
	}
	var list struct{ Snapshots []struct{ ID string } }
	s.do("GET", "/v1/sandboxes/"+sb.ID+"/snapshots", s.key, nil, &list)
	if len(list.Snapshots) != 0 {
		t.Errorf("refused snapshots left records: %+v", list)
	}
	waitFor(t, "the pool to say it waits", time.Minute, func() bool {
		return strings.Contains(s.logText(), "warm pool: not refilling")
	})
	if n := metric(t, s, `space_snapshots_refused_total{reason="disk"}`); n != 1 {
		t.Errorf("snapshots refused for disk: %v, want 1", n)
	}
	if n := metric(t, s, `space_sandbox_creates_refused_total{reason="disk"}`); n != 2 {
		t.Errorf("creates refused for disk: %v, want 2 (a create and a fork)", n)
	}
}

// TestRateLimit: a team's max_rps holds on the API and the E2B control
// plane: a second's worth passes, then 429 rate_limited with Retry-After,
// and a second later requests pass again. Other teams, admin keys and the
// traffic to a sandbox's own server are not counted.
func TestRateLimit(t *testing.T) {
	_, _, s, addr := e2bServer(t)
	key := s.teamKey("rate-a")
	otherKey := s.teamKey("rate-b")
	var sb sandboxView
	if code := s.do("POST", "/v1/sandboxes", key, map[string]any{}, &sb); code != 201 {
		t.Fatalf("create: %d", code)
	}
	defer s.do("DELETE", "/v1/sandboxes/"+sb.ID, s.key, nil, nil)
	startPortServer(t, s, key, sb.ID, 8000)

	var q quotaView
	if code := s.do("PUT", "/v1/teams/rate-a/quota", s.key, map[string]int{"max_rps": 5}, &q); code != 200 || q.MaxRPS != 5 {
		t.Fatalf("set max_rps: %d %+v", code, q)
	}
	count := func(url string, hdr http.Header, n int) (ok int, refused *http.Response) {
		t.Helper()
		for range n {
			req, _ := http.NewRequest("GET", url, nil)
			req.Header = hdr
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case 200:
				ok++
			case 429:
				refused = resp
			default:
				t.Fatalf("GET %s: %d", url, resp.StatusCode)
			}
		}
		return ok, refused
	}
	bearer := func(k string) http.Header { return http.Header{"Authorization": {"Bearer " + k}} }
	ok, refused := count(s.url+"/v1/sandboxes", bearer(key), 30)
	if ok < 5 || refused == nil || refused.Header.Get("Retry-After") != "1" {
		t.Fatalf("30 requests at 5/s: %d passed, refusal %v", ok, refused)
	}
	var e apiError
	code := 0
	for range 20 { // a slow host may refill a token between two requests
		if code = s.do("GET", "/v1/sandboxes", key, nil, &e); code == 429 {
			break
		}
	}
	if code != 429 || e.Error != "rate_limited" || !strings.Contains(e.Message, "5 requests per second") {
		t.Errorf("the refusal: %d %+v", code, e)
	}
	// The Go SDK names it.
	c := space.NewClient(s.url, key)
	var sdkErr error
	for range 20 {
		if _, sdkErr = c.GetSandbox(t.Context(), sb.ID); sdkErr != nil {
			break
		}
	}
	if !space.IsRateLimited(sdkErr) || space.IsQuotaExceeded(sdkErr) {
		t.Errorf("the SDK's error: %v", sdkErr)
	}
	if ok, _ := count(s.url+"/v1/sandboxes", bearer(otherKey), 30); ok != 30 {
		t.Errorf("another team: %d of 30", ok)
	}
	if ok, _ := count(s.url+"/v1/sandboxes", bearer(s.key), 30); ok != 30 {
		t.Errorf("the admin key: %d of 30", ok)
	}
	if ok, _ := count(s.url+"/v1/sandboxes/"+sb.ID+"/ports/8000/page", bearer(key), 30); ok != 30 {
		t.Errorf("the sandbox's own server: %d of 30", ok)
	}
	if ok, refused := count("http://"+addr+"/sandboxes", http.Header{"X-Api-Key": {key}}, 30); ok == 30 || refused == nil || refused.Header.Get("Retry-After") != "1" {
		t.Errorf("the E2B control plane: %d of 30 passed", ok)
	}
	// The bucket refills: requests pass again within a second or so.
	waitFor(t, "the team's requests to pass again", 10*time.Second, func() bool {
		return s.do("GET", "/v1/sandboxes", key, nil, nil) == 200
	})
	if code := s.do("DELETE", "/v1/teams/rate-a/quota", s.key, nil, nil); code != 204 {
		t.Fatalf("delete quota: %d", code)
	}
	if ok, _ := count(s.url+"/v1/sandboxes", bearer(key), 30); ok != 30 {
		t.Errorf("without the quota: %d of 30", ok)
	}
}
