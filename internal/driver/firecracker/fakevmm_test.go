package firecracker

// TEST DOUBLE. This file is a stand-in for Firecracker's API server and, run
// as a process (the test binary re-executed, see TestMain), for the
// firecracker and jailer binaries. It exists only in tests, so the driver's
// request sequences and process-launch paths can be exercised on hosts
// that cannot run Firecracker. Nothing outside _test.go files uses it.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// fakeVMM checks every call against Firecracker's documented API (swagger:
// required fields, field types, enum values, no unknown fields; pre-boot
// calls refused after start; snapshot/create only while Paused;
// snapshot/load only on a fresh process, resolving the snapshot's drive and
// vsock paths relative to the new process) and keeps the state a real
// Firecracker would. Refusals are answered as Firecracker does: 400 with
// {"fault_message": ...}. Every call is recorded in order.
type fakeVMM struct {
	id         string
	root       string // relative paths resolve here (the working directory)
	jailed     bool   // absolute paths resolve inside root (a chroot)
	uid, gid   int    // with jailed: the unprivileged owner files must suit
	failAction string // answer this action_type with a 400 (rollback tests)
	onVsock    func(path string) error
	record     func(fakeCall)

	mu         sync.Mutex
	state      string
	booted     bool // started or loaded: pre-boot calls are refused
	touched    bool // a pre-boot resource was configured: snapshot/load is refused
	trackDirty bool // machine-config track_dirty_pages (Diff snapshots need it)
	boot       *bootSource
	machine    machineConfig
	drives     []drive
	vsock      *vsockDevice
	calls      []fakeCall
}

// fakeCall is one recorded API call.
type fakeCall struct {
	Method string          `json:"method"`
	Path   string          `json:"path"`
	Body   json.RawMessage `json:"body,omitempty"`
	Status int             `json:"status"`
	Fault  string          `json:"fault,omitempty"`
}

func (c fakeCall) String() string { return c.Method + " " + c.Path }

func newFakeVMM(id, root string) *fakeVMM {
	return &fakeVMM{id: id, root: root, state: stateNotStarted, machine: machineConfig{VCPUCount: 1, MemSizeMiB: 128}}
}

// resolve maps a path as the VMM process sees it to one this process can
// open.
func (f *fakeVMM) resolve(p string) string {
	if filepath.IsAbs(p) {
		if !f.jailed {
			return p
		}
		p = strings.TrimPrefix(p, "/")
	}
	return filepath.Join(f.root, p)
}

// Field checks of the swagger schemas.
type fieldCheck func(json.RawMessage) error

func isString(r json.RawMessage) error {
	var s string
	return json.Unmarshal(r, &s)
}

func isBool(r json.RawMessage) error {
	var b bool
	return json.Unmarshal(r, &b)
}

func isObject(r json.RawMessage) error {
	var m map[string]json.RawMessage
	return json.Unmarshal(r, &m)
}

func isArray(r json.RawMessage) error {
	var a []json.RawMessage
	return json.Unmarshal(r, &a)
}

func isInt(lo, hi int64) fieldCheck {
	return func(r json.RawMessage) error {
		n, err := strconv.ParseInt(string(r), 10, 64)
		if err != nil {
			return fmt.Errorf("not an integer: %s", r)
		}
		if n < lo || n > hi {
			return fmt.Errorf("%d out of range [%d, %d]", n, lo, hi)
		}
		return nil
	}
}

func isEnum(values ...string) fieldCheck {
	return func(r json.RawMessage) error {
		var s string
		if err := json.Unmarshal(r, &s); err != nil {
			return err
		}
		if !slices.Contains(values, s) {
			return fmt.Errorf("unknown variant `%s`, expected one of %v", s, values)
		}
		return nil
	}
}

// schema is one swagger definition: its properties and required ones.
type schema struct {
	fields   map[string]fieldCheck
	required []string
}

const maxInt = 1 << 53

var (
	schemaBootSource = schema{fields: map[string]fieldCheck{
		"kernel_image_path": isString, "initrd_path": isString, "boot_args": isString,
	}, required: []string{"kernel_image_path"}}
	schemaDrive = schema{fields: map[string]fieldCheck{
		"drive_id": isString, "partuuid": isString, "is_root_device": isBool,
		"cache_type": isEnum("Unsafe", "Writeback"), "is_read_only": isBool, "path_on_host": isString,
		"rate_limiter": isObject, "io_engine": isEnum("Sync", "Async"), "socket": isString,
	}, required: []string{"drive_id", "is_root_device"}}
	schemaMachine = schema{fields: map[string]fieldCheck{
		"cpu_template": isEnum("C3", "T2", "T2S", "T2CL", "T2A", "V1N1", "None"), "smt": isBool,
		"mem_size_mib": isInt(1, maxInt), "track_dirty_pages": isBool, "vcpu_count": isInt(1, 32),
		"huge_pages": isEnum("None", "Transparent", "2M"),
	}, required: []string{"mem_size_mib", "vcpu_count"}}
	schemaVsock = schema{fields: map[string]fieldCheck{
		"guest_cid": isInt(3, 1<<32-1), "uds_path": isString, "vsock_id": isString,
	}, required: []string{"guest_cid", "uds_path"}}
	schemaAction = schema{fields: map[string]fieldCheck{
		"action_type": isEnum("FlushMetrics", "InstanceStart", "SendCtrlAltDel"),
	}, required: []string{"action_type"}}
	schemaVM = schema{fields: map[string]fieldCheck{
		"state": isEnum("Paused", "Resumed"),
	}, required: []string{"state"}}
	schemaSnapshotCreate = schema{fields: map[string]fieldCheck{
		"mem_file_path": isString, "snapshot_path": isString, "snapshot_type": isEnum("Full", "Diff"),
	}, required: []string{"mem_file_path", "snapshot_path"}}
	schemaSnapshotLoad = schema{fields: map[string]fieldCheck{
		"enable_diff_snapshots": isBool, "track_dirty_pages": isBool, "mem_file_path": isString,
		"mem_backend": isObject, "snapshot_path": isString, "resume_vm": isBool,
		"network_overrides": isArray, "vsock_override": isObject, "clock_realtime": isBool,
	}, required: []string{"snapshot_path"}}
	schemaMemBackend = schema{fields: map[string]fieldCheck{
		"backend_type": isEnum("File", "Uffd"), "backend_path": isString,
	}, required: []string{"backend_type", "backend_path"}}
)

// check validates body against s and decodes it into v.
func (s schema) check(body []byte, v any) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return fmt.Errorf("invalid JSON body: %v", err)
	}
	for _, k := range s.required {
		if _, ok := m[k]; !ok {
			return fmt.Errorf("missing field `%s`", k)
		}
	}
	for k, raw := range m {
		chk, ok := s.fields[k]
		if !ok {
			return fmt.Errorf("unknown field `%s`", k)
		}
		if err := chk(raw); err != nil {
			return fmt.Errorf("field `%s`: %v", k, err)
		}
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(body, v)
}

// fault is a refused call.
type fault struct{ msg string }

func faultf(format string, args ...any) *fault { return &fault{fmt.Sprintf(format, args...)} }

// ServeHTTP implements the API.
func (f *fakeVMM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	status, out, flt := f.handle(r.Method, r.URL.Path, body)
	call := fakeCall{Method: r.Method, Path: r.URL.Path, Status: status}
	if len(body) > 0 {
		call.Body = json.RawMessage(body)
	}
	if flt != nil {
		call.Fault = flt.msg
	}
	f.calls = append(f.calls, call)
	record := f.record
	f.mu.Unlock()
	if record != nil {
		record(call)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	switch {
	case flt != nil:
		json.NewEncoder(w).Encode(map[string]string{"fault_message": flt.msg})
	case out != nil:
		json.NewEncoder(w).Encode(out)
	}
}

// Calls returns the calls so far.
func (f *fakeVMM) Calls() []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

var preBoot = map[string]bool{"/boot-source": true, "/machine-config": true, "/vsock": true}

// handle answers one call, with f.mu held.
func (f *fakeVMM) handle(method, path string, body []byte) (int, any, *fault) {
	bad := func(flt *fault) (int, any, *fault) { return http.StatusBadRequest, nil, flt }
	route := path
	if strings.HasPrefix(path, "/drives/") {
		route = "/drives/"
	}
	if (preBoot[route] || route == "/drives/") && method == http.MethodPut && f.booted {
		return bad(faultf("The requested operation is not supported after starting the microVM."))
	}
	switch method + " " + route {
	case "GET /":
		return http.StatusOK, instanceInfo{AppName: "Firecracker", ID: f.id, State: f.state, VMMVersion: "1.10.1"}, nil
	case "PUT /boot-source":
		var b bootSource
		if err := schemaBootSource.check(body, &b); err != nil {
			return bad(faultf("%v", err))
		}
		if err := f.readable(b.KernelImagePath); err != nil {
			return bad(faultf("Invalid kernel path: %v", err))
		}
		if b.InitrdPath != "" {
			if err := f.readable(b.InitrdPath); err != nil {
				return bad(faultf("Invalid initrd path: %v", err))
			}
		}
		f.boot, f.touched = &b, true
	case "PUT /drives/":
		var d drive
		if err := schemaDrive.check(body, &d); err != nil {
			return bad(faultf("%v", err))
		}
		var m map[string]json.RawMessage
		json.Unmarshal(body, &m)
		if _, vhost := m["socket"]; !vhost {
			for _, k := range []string{"path_on_host", "is_read_only"} {
				if _, ok := m[k]; !ok {
					return bad(faultf("missing field `%s` for a virtio-block drive", k))
				}
			}
		}
		if id := strings.TrimPrefix(path, "/drives/"); id != d.DriveID {
			return bad(faultf("The id from the path [%s] does not match the id from the body [%s]!", id, d.DriveID))
		}
		if err := f.openable(d.PathOnHost, !d.IsReadOnly); err != nil {
			return bad(faultf("Unable to create the block device: %v", err))
		}
		f.drives = slices.DeleteFunc(f.drives, func(x drive) bool { return x.DriveID == d.DriveID })
		f.drives = append(f.drives, d)
		f.touched = true
	case "PUT /machine-config":
		var mc struct {
			machineConfig
			TrackDirtyPages bool `json:"track_dirty_pages"`
		}
		if err := schemaMachine.check(body, &mc); err != nil {
			return bad(faultf("%v", err))
		}
		f.machine, f.trackDirty, f.touched = mc.machineConfig, mc.TrackDirtyPages, true
	case "PUT /vsock":
		var v vsockDevice
		if err := schemaVsock.check(body, &v); err != nil {
			return bad(faultf("%v", err))
		}
		if _, err := os.Stat(filepath.Dir(f.resolve(v.UDSPath))); err != nil {
			return bad(faultf("Cannot create vsock device: %v", err))
		}
		f.vsock, f.touched = &v, true
	case "PUT /actions":
		var a instanceAction
		if err := schemaAction.check(body, &a); err != nil {
			return bad(faultf("%v", err))
		}
		if a.ActionType == f.failAction {
			return bad(faultf("Failed to start microVM: injected failure of %s", a.ActionType))
		}
		if a.ActionType != actionInstanceStart {
			break
		}
		if f.booted {
			return bad(faultf("The requested operation is not supported after starting the microVM."))
		}
		if f.boot == nil {
			return bad(faultf("Cannot start microvm without kernel configuration."))
		}
		if err := f.startDevices(); err != nil {
			return bad(faultf("Failed to start microVM: %v", err))
		}
		f.state, f.booted = stateRunning, true
	case "PATCH /vm":
		var v vmState
		if err := schemaVM.check(body, &v); err != nil {
			return bad(faultf("%v", err))
		}
		if !f.booted {
			return bad(faultf("The requested operation is not supported before starting the microVM."))
		}
		if v.State == statePaused {
			f.state = statePaused
		} else {
			f.state = stateRunning
		}
	case "PUT /snapshot/create":
		var s snapshotCreate
		if err := schemaSnapshotCreate.check(body, &s); err != nil {
			return bad(faultf("%v", err))
		}
		if !f.booted {
			return bad(faultf("The requested operation is not supported before starting the microVM."))
		}
		if f.state != statePaused {
			return bad(faultf("Cannot save the microVM state: the microVM must be paused (state %s)", f.state))
		}
		if s.SnapshotType == "Diff" && !f.trackDirty {
			return bad(faultf("Diff snapshots require dirty page tracking"))
		}
		if err := f.writeSnapshot(s); err != nil {
			return bad(faultf("Cannot create snapshot: %v", err))
		}
	case "PUT /snapshot/load":
		if f.booted || f.touched {
			return bad(faultf("Loading a microVM snapshot not allowed after configuring boot-specific resources."))
		}
		var raw struct {
			snapshotLoad
			MemFilePath *string         `json:"mem_file_path"`
			MemBackend  json.RawMessage `json:"mem_backend"`
		}
		if err := schemaSnapshotLoad.check(body, &raw); err != nil {
			return bad(faultf("%v", err))
		}
		if (raw.MemFilePath == nil) == (raw.MemBackend == nil) {
			return bad(faultf("Exactly one of mem_file_path or mem_backend must be present"))
		}
		memPath := ""
		if raw.MemFilePath != nil {
			memPath = *raw.MemFilePath
		} else {
			var mb memBackend
			if err := schemaMemBackend.check(raw.MemBackend, &mb); err != nil {
				return bad(faultf("mem_backend: %v", err))
			}
			if mb.BackendType != backendFile {
				return bad(faultf("this fake serves File memory backends only"))
			}
			memPath = mb.BackendPath
		}
		if err := f.readable(memPath); err != nil {
			return bad(faultf("Cannot open the memory file: %v", err))
		}
		if err := f.loadSnapshot(raw.SnapshotPath); err != nil {
			return bad(faultf("Cannot load snapshot: %v", err))
		}
		if raw.ResumeVM {
			f.state = stateRunning
		}
	default:
		return bad(faultf("Invalid request method and/or path: %s %s.", method, path))
	}
	return http.StatusNoContent, nil, nil
}

// fakeSnapshot is what the fake writes as a microVM state file: the
// configuration a restore must find again.
type fakeSnapshot struct {
	Boot    *bootSource   `json:"boot"`
	Machine machineConfig `json:"machine"`
	Drives  []drive       `json:"drives"`
	Vsock   *vsockDevice  `json:"vsock"`
}

func (f *fakeVMM) writeSnapshot(s snapshotCreate) error {
	b, _ := json.Marshal(fakeSnapshot{Boot: f.boot, Machine: f.machine, Drives: f.drives, Vsock: f.vsock})
	if err := f.create(s.SnapshotPath, b); err != nil {
		return err
	}
	if err := f.create(s.MemFilePath, nil); err != nil {
		return err
	}
	return os.Truncate(f.resolve(s.MemFilePath), int64(f.machine.MemSizeMiB)<<20)
}

// loadSnapshot restores the configuration from a state file: every drive
// and the vsock socket must be found again relative to this process.
func (f *fakeVMM) loadSnapshot(path string) error {
	if err := f.readable(path); err != nil {
		return err
	}
	b, err := os.ReadFile(f.resolve(path))
	if err != nil {
		return err
	}
	var s fakeSnapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("bad state file: %v", err)
	}
	for _, d := range s.Drives {
		if err := f.openable(d.PathOnHost, !d.IsReadOnly); err != nil {
			return fmt.Errorf("drive %s: %v", d.DriveID, err)
		}
	}
	f.boot, f.machine, f.drives, f.vsock = s.Boot, s.Machine, s.Drives, s.Vsock
	if err := f.startDevices(); err != nil {
		return err
	}
	f.state, f.booted = statePaused, true
	return nil
}

// startDevices opens the vsock socket, as Firecracker does at start.
func (f *fakeVMM) startDevices() error {
	if f.vsock == nil || f.onVsock == nil {
		return nil
	}
	p := f.resolve(f.vsock.UDSPath)
	if _, err := os.Lstat(p); err == nil {
		return fmt.Errorf("vsock socket %s already exists", f.vsock.UDSPath)
	}
	return f.onVsock(p)
}

// create writes a file as the VMM would (owned by its uid when jailed).
func (f *fakeVMM) create(path string, data []byte) error {
	p := f.resolve(path)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return err
	}
	if f.jailed {
		return os.Lchown(p, f.uid, f.gid)
	}
	return nil
}

func (f *fakeVMM) readable(path string) error { return f.openable(path, false) }

// openable checks that the VMM could open path (for writing, with write):
// the file exists and, jailed, its owner and mode let the unprivileged
// uid at it, as they must for the real jailed Firecracker.
func (f *fakeVMM) openable(path string, write bool) error {
	fi, err := os.Stat(f.resolve(path))
	if err != nil {
		return err
	}
	if !f.jailed {
		return nil
	}
	st := fi.Sys().(*syscall.Stat_t)
	mode := uint32(fi.Mode().Perm())
	bit := uint32(0o4)
	if write {
		bit = 0o2
	}
	switch {
	case int(st.Uid) == f.uid && mode&(bit<<6) != 0,
		int(st.Gid) == f.gid && mode&(bit<<3) != 0,
		mode&bit != 0:
		return nil
	}
	return fmt.Errorf("%s: permission denied for uid %d (owner %d, mode %o)", path, f.uid, st.Uid, mode)
}

// serveFake serves f on a unix socket in a temporary directory.
func serveFake(t *testing.T, f *fakeVMM) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: f}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// serveVsock emulates Firecracker's vsock socket at path: a CONNECT to
// AgentPort is answered and then echoed (the "agent"); any other port is
// refused by closing, as when no guest socket listens.
func serveVsock(path string) error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				line, err := br.ReadString('\n')
				if err != nil || strings.TrimSpace(line) != fmt.Sprintf("CONNECT %d", AgentPort) {
					return
				}
				io.WriteString(c, "OK 1073741824\n")
				io.Copy(c, br)
			}()
		}
	}()
	return nil
}

// The test double as a process. TestMain (below) turns the test binary into
// it when fakeEnv is set; the tests point Config.Firecracker and
// Config.Jailer at symlinks to the test binary.
const (
	fakeEnv         = "SPACE_FIRECRACKER_TEST_DOUBLE" // directory for the call logs
	fakeFailEnv     = "SPACE_FIRECRACKER_TEST_DOUBLE_FAIL"
	fakeJailEnv     = "SPACE_FIRECRACKER_TEST_DOUBLE_JAILED" // "uid:gid", set by the fake jailer
	fakeVersion     = "1.10.1"
	fakePanicOutput = "Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)"
)

func TestMain(m *testing.M) {
	if dir, ok := os.LookupEnv(fakeEnv); ok {
		os.Exit(fakeMain(dir, os.Args))
	}
	os.Exit(m.Run())
}

func fakeMain(logDir string, argv []string) int {
	args := argv[1:]
	switch {
	case len(args) == 1 && args[0] == "--version":
		if strings.Contains(filepath.Base(argv[0]), "jailer") {
			fmt.Println("Jailer v" + fakeVersion)
		} else {
			fmt.Printf("Firecracker v%s\n\nSupported snapshot data format versions: 4.0.0\n", fakeVersion)
		}
		return 0
	case slices.Contains(args, "--exec-file"):
		return fakeJailer(args)
	case slices.Contains(args, "--no-api"):
		// The KVM boot probe: a kernel without a root disk panics.
		fmt.Println(fakePanicOutput)
		return 0
	}
	return fakeFirecracker(logDir, args)
}

var fakeJailerIDRE = regexp.MustCompile(`^[a-zA-Z0-9-]{1,64}$`)

// fakeJailer does what docs/jailer.md says the jailer does, minus the
// chroot and the privilege drop (it runs the fake firecracker in the jail
// directory instead and tells it the uid it would have).
func fakeJailer(args []string) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "fake jailer: "+format+"\n", a...)
		return 1
	}
	opts := map[string]string{}
	var cgroupFiles []string // every --cgroup FILE=VALUE, in order
	newPidNS := false
	var rest []string
	for k := 0; k < len(args); k++ {
		switch a := args[k]; a {
		case "--":
			rest = args[k+1:]
			k = len(args)
		case "--new-pid-ns", "--daemonize":
			newPidNS = newPidNS || a == "--new-pid-ns"
		case "--id", "--exec-file", "--uid", "--gid", "--chroot-base-dir", "--cgroup-version",
			"--parent-cgroup", "--netns", "--cgroup", "--resource-limit":
			if k+1 >= len(args) {
				return fail("%s needs a value", a)
			}
			opts[a] = args[k+1]
			if a == "--cgroup" {
				cgroupFiles = append(cgroupFiles, args[k+1])
			}
			k++
		default:
			return fail("unknown argument %q", a)
		}
	}
	for _, req := range []string{"--id", "--exec-file", "--uid", "--gid"} {
		if opts[req] == "" {
			return fail("missing %s", req)
		}
	}
	id, exe := opts["--id"], opts["--exec-file"]
	if !fakeJailerIDRE.MatchString(id) {
		return fail("invalid id %q", id)
	}
	if !filepath.IsAbs(exe) || !strings.Contains(filepath.Base(exe), "firecracker") {
		return fail("exec file %q must be an absolute path whose name contains firecracker", exe)
	}
	uid, err1 := strconv.Atoi(opts["--uid"])
	gid, err2 := strconv.Atoi(opts["--gid"])
	if err1 != nil || err2 != nil {
		return fail("bad uid/gid")
	}
	base := opts["--chroot-base-dir"]
	if base == "" {
		base = "/srv/jailer"
	}
	if !filepath.IsAbs(base) {
		return fail("chroot base dir must be absolute")
	}
	if v := opts["--cgroup-version"]; v != "" && v != "1" && v != "2" {
		return fail("bad cgroup version %q", v)
	}
	// Like the jailer: make <controller root>/<parent>/<id> for every
	// --cgroup file, write the values, and join those cgroups before
	// starting Firecracker (so it starts inside them).
	if len(cgroupFiles) > 0 {
		parent := opts["--parent-cgroup"]
		if parent == "" {
			parent = filepath.Base(exe)
		}
		joined := map[string]bool{}
		for _, fv := range cgroupFiles {
			file, value, ok := strings.Cut(fv, "=")
			controller, _, ok2 := strings.Cut(file, ".")
			if !ok || !ok2 {
				return fail("bad --cgroup %q", fv)
			}
			dir := filepath.Join("/sys/fs/cgroup", parent, id)
			if opts["--cgroup-version"] != "2" {
				dir = filepath.Join("/sys/fs/cgroup", controller, parent, id)
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fail("cgroup: %v", err)
			}
			if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
				return fail("cgroup %s: %v", fv, err)
			}
			if !joined[dir] {
				joined[dir] = true
				if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
					return fail("join cgroup: %v", err)
				}
			}
		}
	}
	name := filepath.Base(exe)
	chroot := filepath.Join(base, name, id, "root")
	if err := os.MkdirAll(filepath.Join(chroot, "dev"), 0o755); err != nil {
		return fail("%v", err)
	}
	jailed := filepath.Join(chroot, name)
	if out, err := exec.Command("cp", exe, jailed).CombinedOutput(); err != nil {
		return fail("copy exec file: %v: %s", err, out)
	}
	if os.Geteuid() == 0 {
		if err := os.Lchown(chroot, uid, gid); err != nil {
			return fail("chown jail: %v", err)
		}
	}
	cmd := exec.Command(jailed, append([]string{"--id=" + id, "--start-time-us=0", "--start-time-cpu-us=0"}, rest...)...)
	cmd.Dir = chroot
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%d", fakeJailEnv, uid, gid))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if !newPidNS {
		if err := os.Chdir(chroot); err != nil {
			return fail("%v", err)
		}
		return fail("exec: %v", syscall.Exec(jailed, cmd.Args, cmd.Env))
	}
	if err := cmd.Start(); err != nil {
		return fail("spawn: %v", err)
	}
	if err := os.WriteFile(filepath.Join(chroot, name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return fail("pid file: %v", err)
	}
	return 0
}

// fakeFirecracker serves the API (fakeVMM) on --api-sock until killed,
// appending every call to <logDir>/<id>.calls as JSON lines.
func fakeFirecracker(logDir string, args []string) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "fake firecracker: "+format+"\n", a...)
		return 1
	}
	var id, apiSock string
	for k := 0; k < len(args); k++ {
		switch a := args[k]; {
		case strings.HasPrefix(a, "--id="):
			id = strings.TrimPrefix(a, "--id=")
		case a == "--api-sock" && k+1 < len(args):
			apiSock = args[k+1]
			k++
		case strings.HasPrefix(a, "--start-time-"):
		default:
			return fail("unknown argument %q", a)
		}
	}
	if id == "" || apiSock == "" {
		return fail("need --id and --api-sock")
	}
	f := newFakeVMM(id, ".") // the working directory is the VM's root
	f.failAction = os.Getenv(fakeFailEnv)
	if ug := os.Getenv(fakeJailEnv); ug != "" {
		f.jailed = true
		fmt.Sscanf(ug, "%d:%d", &f.uid, &f.gid)
	}
	f.onVsock = serveVsock
	logf, err := os.OpenFile(filepath.Join(logDir, id+".calls"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fail("%v", err)
	}
	f.record = func(c fakeCall) {
		b, _ := json.Marshal(c)
		logf.Write(append(b, '\n'))
	}
	ln, err := net.Listen("unix", f.resolve(apiSock))
	if err != nil {
		return fail("api socket: %v", err)
	}
	fmt.Println("fake firecracker: serving", id)
	return fail("%v", http.Serve(ln, f))
}

// readCalls reads the call log the fake process wrote for id.
func readCalls(t *testing.T, logDir, id string) []fakeCall {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(logDir, id+".calls"))
	if err != nil {
		t.Fatal(err)
	}
	var calls []fakeCall
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var c fakeCall
		if err := json.Unmarshal(line, &c); err != nil {
			t.Fatalf("call log: %v", err)
		}
		calls = append(calls, c)
	}
	return calls
}
