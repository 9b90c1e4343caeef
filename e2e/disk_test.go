package e2e

import (
	"strings"
	"testing"
)

// TestDiskQuota: a sandbox reserves disk_mb of host disk (default 10240),
// which counts against its team's max_disk_mb as memory and CPUs do: a
// create past it is refused with 429 quota_exceeded and makes nothing;
// bad values are a 400 naming disk_mb. gVisor enforces the reservation:
// a sandbox of 256 MiB cannot write 400 MB.
func TestDiskQuota(t *testing.T) {
	s := sharedServer(t)
	key := s.teamKey("disk-a")
	path := "/v1/teams/disk-a/quota"
	var q quotaView
	if code := s.do("PUT", path, s.key, map[string]int{"max_disk_mb": 3072}, &q); code != 200 || q.MaxDiskMB != 3072 {
		t.Fatalf("disk quota: %d %+v", code, q)
	}
	t.Cleanup(func() { s.do("DELETE", path, s.key, nil, nil) })
	var e apiError
	for _, bad := range []any{100, 10241, -5, "lots"} {
		if code := s.do("POST", "/v1/sandboxes", key, map[string]any{"disk_mb": bad}, &e); code != 400 || !strings.Contains(e.Message, "disk_mb") {
			t.Errorf("disk_mb %v: %d %+v", bad, code, e)
		}
	}
	if code := s.do("PUT", path, s.key, map[string]int{"max_disk_mb": -1}, &e); code != 400 || !strings.Contains(e.Message, "max_disk_mb") {
		t.Errorf("a negative disk quota: %d %+v", code, e)
	}
	type created struct {
		ID     string `json:"id"`
		DiskMB int    `json:"disk_mb"`
		apiError
	}
	create := func(body map[string]any) (int, created) {
		var out created
		code := s.do("POST", "/v1/sandboxes", key, body, &out)
		if code == 201 {
			t.Cleanup(func() { s.do("DELETE", "/v1/sandboxes/"+out.ID, key, nil, nil) })
		}
		return code, out
	}
	// The default reservation (10240) does not fit in 3072.
	if code, out := create(map[string]any{}); code != 429 || out.Error != "quota_exceeded" || !strings.Contains(out.Message, "MiB of sandbox disk") {
		t.Errorf("a default create past the disk quota: %d %+v", code, out)
	}
	code, a := create(map[string]any{"disk_mb": 2048})
	if code != 201 || a.DiskMB != 2048 {
		t.Fatalf("create of 2048 MiB: %d %+v", code, a)
	}
	if code, out := create(map[string]any{"disk_mb": 1025}); code != 429 || !strings.Contains(out.Message, "2048 of its 3072 MiB") {
		t.Errorf("1025 MiB more with 1024 left: %d %+v", code, out)
	}
	if code, _ := create(map[string]any{"disk_mb": 1024}); code != 201 {
		t.Errorf("exactly at the disk quota: %d", code)
	}
	s.do("GET", path, key, nil, &q)
	if q.Usage.DiskMB != 3072 || q.Usage.Sandboxes != 2 {
		t.Errorf("usage: %+v", q.Usage)
	}
	// A fork needs its parent's reservation again.
	if code := s.do("POST", "/v1/sandboxes/"+a.ID+"/fork", key, map[string]int{"count": 1}, &e); code != 429 || e.Error != "quota_exceeded" {
		t.Errorf("fork past the disk quota: %d %+v", code, e)
	}

	// A VM's disk is its template image: a smaller disk_mb is refused
	// (the overlay could grow past it, uncounted).
	if len(sharedServerDrivers()) > 0 { // the shared server runs qemu
		if code := s.do("POST", "/v1/sandboxes", key, map[string]any{"driver": "qemu", "disk_mb": 256}, &e); code != 400 || !strings.Contains(e.Message, "template image") {
			t.Errorf("a qemu sandbox of 256 MiB: %d %+v", code, e)
		}
		t.Logf("qemu, disk_mb 256: %s", e.Message)
	}

	// The driver holds the sandbox to it.
	other := s.teamKey("disk-b")
	var sb sandboxView
	if code := s.do("POST", "/v1/sandboxes", other, map[string]any{"disk_mb": 256}, &sb); code != 201 {
		t.Fatalf("create of 256 MiB: %d", code)
	}
	t.Cleanup(func() { s.do("DELETE", "/v1/sandboxes/"+sb.ID, other, nil, nil) })
	var r execResult
	if code := s.do("POST", "/v1/sandboxes/"+sb.ID+"/exec", other, map[string]any{"cmd": "head -c 400000000 /dev/zero > /home/user/big; echo rc=$?; rm -f /home/user/big"}, &r); code != 200 {
		t.Fatalf("exec: %d", code)
	}
	if strings.Contains(r.Stdout, "rc=0") {
		t.Errorf("a 256 MiB sandbox wrote 400 MB: %+v", r)
	}
	t.Logf("400 MB into 256 MiB: %q %q", strings.TrimSpace(r.Stdout), strings.TrimSpace(r.Stderr))
}
