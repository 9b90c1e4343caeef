package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
)

// vmRoot makes a VM root directory holding what Create puts there.
func vmRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range []string{kernelName, initrdName, diskName} {
		if err := os.WriteFile(filepath.Join(root, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// callNames renders calls as "METHOD /path" plus the enum value that
// matters (action_type, state, snapshot_type), leaving out GET polls.
func callNames(calls []fakeCall) []string {
	var out []string
	for _, c := range calls {
		if c.Method == http.MethodGet {
			continue
		}
		s := c.String()
		var b map[string]any
		json.Unmarshal(c.Body, &b)
		for _, k := range []string{"action_type", "state", "snapshot_type"} {
			if v, ok := b[k].(string); ok {
				s += " " + v
			}
		}
		out = append(out, s)
	}
	return out
}

// TestAPISequence runs the driver's request sequences against the stub:
// boot, pause, snapshot, resume on one VM, then a load into a fresh one
// laid out the same way. The stub checks each body against the documented
// API and the ordering rules, so any refusal fails the test.
func TestAPISequence(t *testing.T) {
	ctx := t.Context()
	root := vmRoot(t)
	vm := newFakeVMM("sb-parent", root)
	vm.onVsock = serveVsock
	c := newAPIClient(serveFake(t, vm))
	m := machine{VCPU: 2, MemoryMB: 256, BootArgs: bootArgs("box")}
	if err := c.run(ctx, bootSequence(m)); err != nil {
		t.Fatalf("boot: %v", err)
	}
	if info, err := c.info(ctx); err != nil || info.State != stateRunning {
		t.Fatalf("after boot: %+v, %v", info, err)
	}
	steps := []apiCall{
		{"PATCH", "/vm", vmState{State: statePaused}},
		{"PUT", "/snapshot/create", snapshotCreate{SnapshotType: snapshotFull, SnapshotPath: snapStateTmp, MemFilePath: snapMemoryTmp}},
		{"PATCH", "/vm", vmState{State: stateResumed}},
	}
	if err := c.run(ctx, steps); err != nil {
		t.Fatal(err)
	}
	// A fresh VM in another root with the snapshot's files under the
	// driver's restore names and its own disk.
	root2 := t.TempDir()
	for from, to := range map[string]string{snapStateTmp: stateName, snapMemoryTmp: memoryName, diskName: diskName} {
		if err := os.Link(filepath.Join(root, from), filepath.Join(root2, to)); err != nil {
			t.Fatal(err)
		}
	}
	vm2 := newFakeVMM("sb-child", root2)
	vm2.onVsock = serveVsock
	c2 := newAPIClient(serveFake(t, vm2))
	if err := c2.do(ctx, "PUT", "/snapshot/load", snapshotLoad{
		SnapshotPath: stateName, MemBackend: memBackend{BackendType: backendFile, BackendPath: memoryName}, ResumeVM: true,
	}, nil); err != nil {
		t.Fatalf("load: %v", err)
	}
	if info, _ := c2.info(ctx); info.State != stateRunning {
		t.Errorf("loaded VM state %q, want Running", info.State)
	}
	want := []string{
		"PUT /boot-source", "PUT /drives/rootfs", "PUT /machine-config", "PUT /vsock",
		"PUT /actions InstanceStart", "PATCH /vm Paused", "PUT /snapshot/create Full", "PATCH /vm Resumed",
	}
	if got := callNames(vm.Calls()); !slices.Equal(got, want) {
		t.Errorf("parent calls\n got %q\nwant %q", got, want)
	}
	if got := callNames(vm2.Calls()); !slices.Equal(got, []string{"PUT /snapshot/load"}) {
		t.Errorf("child calls %q", got)
	}
	for _, call := range append(vm.Calls(), vm2.Calls()...) {
		if call.Status/100 != 2 {
			t.Errorf("%s refused: %d %s", call, call.Status, call.Fault)
		}
	}
	// The boot body as sent.
	var bs bootSource
	json.Unmarshal(vm.Calls()[0].Body, &bs)
	if bs.KernelImagePath != kernelName || bs.InitrdPath != initrdName || !strings.HasSuffix(bs.BootArgs, "-- --init --vsock 1024") {
		t.Errorf("boot source %+v", bs)
	}
}

// TestFakeVMMEnforcesAPI shows the stub refuses what Firecracker refuses,
// so TestAPISequence passing means the driver's requests are valid.
func TestFakeVMMEnforcesAPI(t *testing.T) {
	type req struct{ method, path, body string }
	boot := []req{
		{"PUT", "/boot-source", `{"kernel_image_path":"vmlinux"}`},
		{"PUT", "/drives/rootfs", `{"drive_id":"rootfs","path_on_host":"rootfs.ext4","is_root_device":false,"is_read_only":false}`},
		{"PUT", "/vsock", `{"guest_cid":3,"uds_path":"v.sock"}`},
		{"PUT", "/actions", `{"action_type":"InstanceStart"}`},
	}
	for _, c := range []struct {
		name  string
		setup []req
		bad   req
		fault string
	}{
		{"boot source without kernel", nil, req{"PUT", "/boot-source", `{"boot_args":"x"}`}, "missing field `kernel_image_path`"},
		{"missing kernel file", nil, req{"PUT", "/boot-source", `{"kernel_image_path":"nope"}`}, "Invalid kernel path"},
		{"unknown field", nil, req{"PUT", "/boot-source", `{"kernel_image_path":"vmlinux","initrd":"x"}`}, "unknown field `initrd`"},
		{"drive without is_root_device", nil, req{"PUT", "/drives/rootfs", `{"drive_id":"rootfs","path_on_host":"rootfs.ext4","is_read_only":false}`}, "missing field `is_root_device`"},
		{"drive id mismatch", nil, req{"PUT", "/drives/a", `{"drive_id":"b","path_on_host":"rootfs.ext4","is_root_device":false,"is_read_only":true}`}, "does not match"},
		{"zero vcpus", nil, req{"PUT", "/machine-config", `{"vcpu_count":0,"mem_size_mib":128}`}, "out of range"},
		{"33 vcpus", nil, req{"PUT", "/machine-config", `{"vcpu_count":33,"mem_size_mib":128}`}, "out of range"},
		{"reserved guest cid", nil, req{"PUT", "/vsock", `{"guest_cid":2,"uds_path":"v.sock"}`}, "out of range"},
		{"bad action", nil, req{"PUT", "/actions", `{"action_type":"Stop"}`}, "unknown variant"},
		{"start without kernel", nil, req{"PUT", "/actions", `{"action_type":"InstanceStart"}`}, "without kernel"},
		{"pause before start", nil, req{"PATCH", "/vm", `{"state":"Paused"}`}, "before starting"},
		{"bad vm state", boot, req{"PATCH", "/vm", `{"state":"Stopped"}`}, "unknown variant"},
		{"snapshot while running", boot, req{"PUT", "/snapshot/create", `{"snapshot_type":"Full","snapshot_path":"s","mem_file_path":"m"}`}, "must be paused"},
		{"bad snapshot type", boot, req{"PUT", "/snapshot/create", `{"snapshot_type":"Incremental","snapshot_path":"s","mem_file_path":"m"}`}, "unknown variant"},
		{"drive after start", boot, req{"PUT", "/drives/x", `{"drive_id":"x","path_on_host":"rootfs.ext4","is_root_device":false,"is_read_only":true}`}, "after starting"},
		{"load after configuring", boot[:1], req{"PUT", "/snapshot/load", `{"snapshot_path":"s","mem_backend":{"backend_type":"File","backend_path":"m"}}`}, "not allowed after configuring"},
		{"load with two memory sources", nil, req{"PUT", "/snapshot/load", `{"snapshot_path":"s","mem_file_path":"m","mem_backend":{"backend_type":"File","backend_path":"m"}}`}, "Exactly one"},
		{"load with bad backend", nil, req{"PUT", "/snapshot/load", `{"snapshot_path":"s","mem_backend":{"backend_type":"Disk","backend_path":"m"}}`}, "unknown variant"},
		{"unknown path", nil, req{"PUT", "/reboot", `{}`}, "Invalid request"},
	} {
		t.Run(c.name, func(t *testing.T) {
			vm := newFakeVMM("sb-x", vmRoot(t))
			vm.onVsock = func(string) error { return nil }
			for _, r := range c.setup {
				if st, _, f := vm.handle(r.method, r.path, []byte(r.body)); st/100 != 2 {
					t.Fatalf("setup %s %s: %d %v", r.method, r.path, st, f)
				}
			}
			st, _, f := vm.handle(c.bad.method, c.bad.path, []byte(c.bad.body))
			if st != http.StatusBadRequest || f == nil || !strings.Contains(f.msg, c.fault) {
				t.Errorf("got %d %+v, want 400 with %q", st, f, c.fault)
			}
		})
	}
}

// TestAPIErrorSurfacing: an error answer becomes an *APIError carrying
// Firecracker's fault_message, of class internal; an absent socket is
// unavailable.
func TestAPIErrorSurfacing(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/raw" {
			http.Error(w, "not json", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"fault_message":"Invalid kernel path: No such file or directory (os error 2)"}`))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	c := newAPIClient(sock)
	err = c.do(t.Context(), "PUT", "/boot-source", bootSource{KernelImagePath: "nope"}, nil)
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Fault != "Invalid kernel path: No such file or directory (os error 2)" {
		t.Fatalf("err = %#v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "PUT /boot-source") || !strings.Contains(msg, "Invalid kernel path") {
		t.Errorf("message %q", msg)
	}
	if code, status := errdefs.Classify(err); code != "internal" || status != 500 {
		t.Errorf("class %s %d", code, status)
	}
	err = c.do(t.Context(), "GET", "/raw", nil, nil)
	if !errors.As(err, &apiErr) || apiErr.Status != 500 || apiErr.Fault != "not json" {
		t.Errorf("raw error body: %#v", err)
	}
	err = newAPIClient(filepath.Join(t.TempDir(), "none.sock")).do(t.Context(), "GET", "/", nil, nil)
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("no socket: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := c.do(ctx, "GET", "/", nil, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

// TestDialUnixLongPath reaches a socket whose path does not fit sun_path.
func TestDialUnixLongPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", shortBind(t, dir, "api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	if len(sock) <= maxSunPath {
		t.Fatalf("test path too short: %d", len(sock))
	}
	c, err := dialUnix(t.Context(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := make([]byte, 2)
	if _, err := c.Read(b); err != nil || string(b) != "hi" {
		t.Errorf("read %q, %v", b, err)
	}
}

// shortBind returns a path that reaches dir/name for bind(2), through a
// descriptor of dir kept open for the test.
func shortBind(t *testing.T, dir, name string) string {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return filepath.Join("/proc/self/fd", strconv.Itoa(int(f.Fd())), name)
}
