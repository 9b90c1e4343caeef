package main

// QEMU rows: the qemu driver through space's HTTP API, side by side with
// raw qemu-system-x86_64 booting the same kernel, initramfs, command line,
// devices and template disk image in the same run (read from the space
// VM's own machine record, so the two cannot drift apart). The raw VM's
// "ready" is the agent's start line on the serial console: the guest has
// booted, mounted its root and started the agent, minus the host-side
// session handshake and Init that space adds. Raw checkpoint, restore and
// fork are the QMP/migration steps the driver performs, driven directly.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/server"
	"github.com/spacesandbox/space/internal/template"
	"github.com/spacesandbox/space/internal/vmimage"
)

var (
	qemuOn      = flag.Bool("qemu", true, "also measure the qemu driver (skipped when QEMU is not installed)")
	qemuSamples = flag.Int("qemu-samples", 3, "samples per qemu row (boots take seconds under TCG)")
)

// qemuMemoryMB is the guest memory of every VM measured.
const qemuMemoryMB = 256

// qemuRows measures the qemu driver against raw QEMU. It starts its own
// server with both drivers and adds rows and a memory note to b.
func (b *bench) qemuRows(agent string) error {
	if !*qemuOn {
		return nil
	}
	qemuBin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		b.notes = append(b.notes, "QEMU rows skipped: qemu-system-x86_64 is not installed.")
		return nil
	}
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		b.notes = append(b.notes, "QEMU rows skipped: qemu-img is not installed.")
		return nil
	}
	data := filepath.Join(b.tmp, "qemu-data")
	s, stopServer, err := b.serve(server.Config{DataDir: data, AgentPath: agent, Drivers: "gvisor,qemu", PoolSize: -1})
	if err != nil {
		return err
	}
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(stopServer) }
	defer stop()
	ctx := context.Background()
	tb, err := template.NewBuilder(filepath.Join(b.cache, "templates"))
	if err != nil {
		return err
	}
	tpl, err := tb.Build(ctx, template.Base(), func(string) {})
	if err != nil {
		return err
	}
	rootImg, err := vmimage.RootImage(ctx, filepath.Join(b.cache, "vm"), tpl.Path, tpl.Digest)
	if err != nil {
		return err
	}
	post := func(path string, body, out any) (time.Duration, error) {
		t0 := time.Now()
		var resp json.RawMessage
		code := s.do("POST", path, body, &resp)
		d := time.Since(t0)
		if code/100 != 2 {
			return 0, fmt.Errorf("POST %s: HTTP %d: %s", path, code, resp)
		}
		if out != nil {
			return d, json.Unmarshal(resp, out)
		}
		return d, nil
	}
	kill := func(id string) { s.do("DELETE", "/v1/sandboxes/"+id, nil, nil) }
	type sandbox struct{ ID string }

	// The first VM tells the raw side what to boot.
	var first sandbox
	d0, err := post("/v1/sandboxes", map[string]any{"driver": "qemu", "memory_mb": qemuMemoryMB}, &first)
	if err != nil {
		return err
	}
	defer kill(first.ID)
	stateDir := filepath.Join(data, "sandboxes", first.ID)
	var m vmMachine
	if j, err := os.ReadFile(filepath.Join(stateDir, "machine.json")); err != nil || json.Unmarshal(j, &m) != nil {
		return fmt.Errorf("qemu machine record of %s: %v", first.ID, err)
	}
	raw := &rawQEMU{qemu: qemuBin, img: qemuImg, root: rootImg, m: m, dir: filepath.Join(b.tmp, "raw-qemu")}
	label := func(op string) string { return "qemu/" + m.Accel + ": " + op }
	create := row{name: label("create (cold, to agent ready)"), rawName: "qemu-img create + qemu-system-x86_64 → agent start line on the console", space: []time.Duration{d0}}
	pause := row{name: label("pause"), rawName: "QMP stop"}
	resume := row{name: label("resume"), rawName: "QMP cont"}
	ckpt := row{name: label("checkpoint (snapshot kind=checkpoint, stored)"), rawName: "QMP stop + migrate to file + copy disk + cont"}
	restore := row{name: label("create from checkpoint (restore, to agent ready)"), rawName: "copy disk + qemu -incoming + cont (running)"}
	fork1 := row{name: label("fork ×1"), rawName: "raw checkpoint + 1 restore"}
	fork5 := row{name: label("fork ×5"), rawName: "raw checkpoint + 5 restores (≤4 at a time)"}
	var spaceRSS, rawRSS []int64

	for i := 0; i < *qemuSamples; i++ {
		id := first.ID
		if i > 0 {
			var sb sandbox
			d, err := post("/v1/sandboxes", map[string]any{"driver": "qemu", "memory_mb": qemuMemoryMB}, &sb)
			if err != nil {
				return err
			}
			create.space = append(create.space, d)
			id = sb.ID
		}
		vm, d, err := raw.boot(fmt.Sprintf("boot%d", i))
		if err != nil {
			if id != first.ID {
				kill(id)
			}
			return err
		}
		create.raw = append(create.raw, d)
		err = func() error {
			defer vm.stop()
			if id != first.ID {
				defer kill(id)
			}
			// Memory once idle: the host RSS of each QEMU process.
			time.Sleep(3 * time.Second)
			if pid, err := strconv.Atoi(strings.TrimSpace(readSmall(filepath.Join(data, "sandboxes", id, "qemu.pid")))); err == nil {
				spaceRSS = append(spaceRSS, processRSS(pid))
			}
			rawRSS = append(rawRSS, processRSS(vm.cmd.Process.Pid))

			d, err := post("/v1/sandboxes/"+id+"/pause", nil, nil)
			if err != nil {
				return err
			}
			pause.space = append(pause.space, d)
			if d, err = post("/v1/sandboxes/"+id+"/resume", nil, nil); err != nil {
				return err
			}
			resume.space = append(resume.space, d)
			if d, err = vm.qmpTimed("stop"); err != nil {
				return err
			}
			pause.raw = append(pause.raw, d)
			if d, err = vm.qmpTimed("cont"); err != nil {
				return err
			}
			resume.raw = append(resume.raw, d)

			var sn struct{ ID string }
			if d, err = post("/v1/sandboxes/"+id+"/snapshots", map[string]string{"kind": "checkpoint"}, &sn); err != nil {
				return err
			}
			ckpt.space = append(ckpt.space, d)
			img := filepath.Join(raw.dir, fmt.Sprintf("ckpt%d", i))
			t0 := time.Now()
			if err := vm.checkpoint(img); err != nil {
				return err
			}
			ckpt.raw = append(ckpt.raw, time.Since(t0))

			var rb sandbox
			if d, err = post("/v1/sandboxes", map[string]string{"snapshot": sn.ID}, &rb); err != nil {
				return err
			}
			restore.space = append(restore.space, d)
			kill(rb.ID)
			t0 = time.Now()
			rvm, err := raw.restore(img, fmt.Sprintf("restore%d", i))
			if err != nil {
				return err
			}
			restore.raw = append(restore.raw, time.Since(t0))
			rvm.stop()
			s.do("DELETE", "/v1/snapshots/"+sn.ID, nil, nil)
			os.RemoveAll(img)

			for _, f := range []struct {
				r *row
				n int
			}{{&fork1, 1}, {&fork5, 5}} {
				var out struct{ Sandboxes []sandbox }
				if d, err = post("/v1/sandboxes/"+id+"/fork", map[string]int{"count": f.n}, &out); err != nil {
					return err
				}
				f.r.space = append(f.r.space, d)
				for _, k := range out.Sandboxes {
					kill(k.ID)
				}
				fimg := filepath.Join(raw.dir, fmt.Sprintf("fork%d-%d", i, f.n))
				t0 := time.Now()
				kids, err := raw.fork(vm, fimg, fmt.Sprintf("fork%d-%d", i, f.n), f.n)
				d := time.Since(t0)
				for _, k := range kids {
					k.stop()
				}
				os.RemoveAll(fimg)
				if err != nil {
					return err
				}
				f.r.raw = append(f.r.raw, d)
			}
			return nil
		}()
		if err != nil {
			return fmt.Errorf("qemu rows: %w", err)
		}
	}
	// The warm row runs its own server: no VM of this one idles meanwhile
	// (sandboxes outlive a server, so they go first).
	kill(first.ID)
	stop()
	warm, err := b.qemuWarmRow(agent, label("create, warm pool refilled by restore (claim)"), create.space)
	if err != nil {
		return fmt.Errorf("qemu warm row: %w", err)
	}
	b.rows = append(b.rows, create, warm, pause, resume, ckpt, restore, fork1, fork5)
	b.notes = append(b.notes, fmt.Sprintf("QEMU warm pool (`--pool-drivers qemu=1:%d`): the pool keeps one post-boot checkpoint and refills by restoring it; "+
		"its raw column is space's own cold QEMU create (first row); a refill costs about one create from checkpoint (row below).",
		qemuMemoryMB))
	b.notes = append(b.notes, fmt.Sprintf("QEMU rows (accelerator %s, %d MiB guests, n=%d): raw QEMU boots the same kernel, initramfs, command line and template disk as the space VM, "+
		"its ready mark being the agent's start line on the serial console; raw checkpoint/restore/fork are the driver's QMP and migration steps driven directly. "+
		"Host RSS of an idle VM's QEMU process: space %s, raw %s.", m.Accel, qemuMemoryMB, *qemuSamples, mibRange(spaceRSS), mibRange(rawRSS)))
	return nil
}

// vmMachine is the qemu driver's machine record (machine.json in a VM's
// state dir): what the raw VM must reproduce.
type vmMachine struct {
	Accel     string `json:"accel"`
	VCPU      int    `json:"vcpu"`
	MemoryMB  int    `json:"memory_mb"`
	Kernel    string `json:"kernel"`
	Initramfs string `json:"initramfs"`
	Cmdline   string `json:"cmdline"`
}

// rawQEMU runs QEMU directly with the qemu driver's machine.
type rawQEMU struct {
	qemu, img, root string
	m               vmMachine
	dir             string
}

// rawVM is one raw QEMU process (a child of the bench, not daemonized).
type rawVM struct {
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

func (r *rawQEMU) args(dir, incoming string) []string {
	cpu := "max"
	if r.m.Accel == "kvm" {
		cpu = "host"
	}
	args := []string{
		"-M", "microvm,accel=" + r.m.Accel + ",acpi=on", "-cpu", cpu,
		"-smp", strconv.Itoa(r.m.VCPU), "-m", strconv.Itoa(r.m.MemoryMB),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", r.m.Kernel, "-initrd", r.m.Initramfs, "-append", r.m.Cmdline,
		"-serial", "stdio",
		"-drive", "id=root,if=none,format=qcow2,file=" + filepath.Join(dir, "disk.qcow2") + ",discard=unmap",
		"-device", "virtio-blk-device,drive=root",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path=" + filepath.Join(dir, "agent.sock") + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=agent",
		"-qmp", "unix:" + filepath.Join(dir, "qmp.sock") + ",server=on,wait=off",
	}
	if incoming != "" {
		args = append(args, "-incoming", incoming)
	}
	return args
}

// launch starts QEMU in dir; each console line goes to line (if set).
func (r *rawQEMU) launch(dir, incoming string, line func(string)) (*rawVM, error) {
	cmd := exec.Command(r.qemu, r.args(dir, incoming)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	vm := &rawVM{dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line != nil {
				line(sc.Text())
			}
		}
		cmd.Wait()
		close(vm.done)
	}()
	return vm, nil
}

// boot creates an overlay over the template image and boots a VM until
// the agent's start line appears on its console.
func (r *rawQEMU) boot(name string) (*rawVM, time.Duration, error) {
	dir := filepath.Join(r.dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, 0, err
	}
	t0 := time.Now()
	if out, err := exec.Command(r.img, "create", "-q", "-f", "qcow2", "-b", r.root, "-F", "raw", filepath.Join(dir, "disk.qcow2")).CombinedOutput(); err != nil {
		return nil, 0, fmt.Errorf("qemu-img create: %v: %s", err, out)
	}
	ready := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var console strings.Builder
	vm, err := r.launch(dir, "", func(l string) {
		mu.Lock()
		console.WriteString(l + "\n")
		mu.Unlock()
		if strings.Contains(l, "space-agent started") {
			once.Do(func() { close(ready) })
		}
	})
	if err != nil {
		return nil, 0, err
	}
	select {
	case <-ready:
		return vm, time.Since(t0), nil
	case <-vm.done:
	case <-time.After(2 * time.Minute):
		vm.stop()
	}
	mu.Lock()
	defer mu.Unlock()
	return nil, 0, fmt.Errorf("raw qemu boot: no agent start line; console:\n%s", lastBytes(console.String(), 2000))
}

// restore starts a VM on a copy of the checkpoint's disk, loading its
// machine state, and returns once the VM runs.
func (r *rawQEMU) restore(img, name string) (*rawVM, error) {
	dir := filepath.Join(r.dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := copySparse(filepath.Join(img, "disk.qcow2"), filepath.Join(dir, "disk.qcow2")); err != nil {
		return nil, err
	}
	vm, err := r.launch(dir, "exec:cat "+filepath.Join(img, "memory"), nil)
	if err != nil {
		return nil, err
	}
	q, err := vm.qmp()
	if err != nil {
		vm.stop()
		return nil, err
	}
	defer q.close()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		var st struct{ Status string }
		if err := q.do("query-status", nil, &st); err != nil {
			vm.stop()
			return nil, err
		}
		switch st.Status {
		case "running":
			return vm, nil
		case "paused", "postmigrate":
			if err := q.do("cont", nil, nil); err != nil {
				vm.stop()
				return nil, err
			}
		case "inmigrate", "prelaunch":
		default:
			vm.stop()
			return nil, fmt.Errorf("raw restore: vm status %q", st.Status)
		}
		time.Sleep(5 * time.Millisecond)
	}
	vm.stop()
	return nil, errors.New("raw restore: timed out")
}

// fork checkpoints vm into img and restores n VMs from it, at most 4 at a
// time (as the sandbox service does).
func (r *rawQEMU) fork(vm *rawVM, img, name string, n int) ([]*rawVM, error) {
	if err := vm.checkpoint(img); err != nil {
		return nil, err
	}
	kids := make([]*rawVM, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			kids[k], errs[k] = r.restore(img, fmt.Sprintf("%s-%d", name, k))
		})
	}
	wg.Wait()
	var out []*rawVM
	for _, k := range kids {
		if k != nil {
			out = append(out, k)
		}
	}
	return out, errors.Join(errs...)
}

// checkpoint stops the VM, migrates its state to img/memory, copies its
// disk and lets it run on: the driver's Checkpoint.
func (v *rawVM) checkpoint(img string) error {
	if err := os.MkdirAll(img, 0o700); err != nil {
		return err
	}
	q, err := v.qmp()
	if err != nil {
		return err
	}
	defer q.close()
	if err := q.do("stop", nil, nil); err != nil {
		return err
	}
	if err := q.do("migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		return err
	}
	if err := q.do("migrate", map[string]any{"uri": "exec:cat > " + filepath.Join(img, "memory")}, nil); err != nil {
		return err
	}
	for {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := q.do("query-migrate", nil, &st); err != nil {
			return err
		}
		if st.Status == "completed" {
			break
		}
		if st.Status == "failed" || st.Status == "cancelled" {
			return fmt.Errorf("raw migration %s: %s", st.Status, st.ErrorDesc)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := copySparse(filepath.Join(v.dir, "disk.qcow2"), filepath.Join(img, "disk.qcow2")); err != nil {
		return err
	}
	return q.do("cont", nil, nil)
}

// qmpTimed runs one QMP command on a fresh connection (as the driver
// does) and times it.
func (v *rawVM) qmpTimed(cmd string) (time.Duration, error) {
	t0 := time.Now()
	q, err := v.qmp()
	if err != nil {
		return 0, err
	}
	defer q.close()
	err = q.do(cmd, nil, nil)
	return time.Since(t0), err
}

func (v *rawVM) stop() {
	_ = v.cmd.Process.Kill()
	<-v.done
	os.RemoveAll(v.dir)
}

// qmpConn is a minimal QMP client.
type qmpConn struct {
	c  net.Conn
	rd *bufio.Reader
}

func (v *rawVM) qmp() (*qmpConn, error) {
	path := filepath.Join(v.dir, "qmp.sock")
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			q := &qmpConn{c: c, rd: bufio.NewReader(c)}
			c.SetDeadline(time.Now().Add(2 * time.Minute))
			if _, err := q.rd.ReadBytes('\n'); err != nil { // greeting
				c.Close()
				return nil, err
			}
			if err := q.do("qmp_capabilities", nil, nil); err != nil {
				c.Close()
				return nil, err
			}
			return q, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("qmp: %w", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (q *qmpConn) close() { q.c.Close() }

func (q *qmpConn) do(cmd string, args, out any) error {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	j, _ := json.Marshal(req)
	if _, err := q.c.Write(append(j, '\n')); err != nil {
		return err
	}
	for {
		line, err := q.rd.ReadBytes('\n')
		if err != nil {
			return fmt.Errorf("qmp %s: %w", cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Desc string `json:"desc"`
			} `json:"error"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return err
		}
		switch {
		case resp.Error != nil:
			return fmt.Errorf("qmp %s: %s", cmd, resp.Error.Desc)
		case resp.Return != nil:
			if out != nil {
				return json.Unmarshal(resp.Return, out)
			}
			return nil
		}
		// an event: skip
	}
}

func copySparse(src, dst string) error {
	if out, err := exec.Command("cp", "--reflink=auto", "--sparse=always", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("cp %s: %v: %s", src, err, out)
	}
	return nil
}

func readSmall(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// processRSS is a process's resident set size in bytes (0 if unknown).
func processRSS(pid int) int64 {
	for _, l := range strings.Split(readSmall(fmt.Sprintf("/proc/%d/status", pid)), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// mibRange formats RSS samples as "min–max MiB (n)".
func mibRange(xs []int64) string {
	if len(xs) == 0 {
		return "n/a"
	}
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = min(lo, x), max(hi, x)
	}
	return fmt.Sprintf("%d–%d MiB (n=%d)", lo>>20, hi>>20, len(xs))
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// qemuWarmRow measures creates served by a QEMU warm pool that refills by
// restoring its post-boot image, on a server of its own with a pool of
// one: every sample waits until the pool is ready again, so each claim is
// of a restored VM. cold is the cold create row, the comparison column.
func (b *bench) qemuWarmRow(agent, name string, cold []time.Duration) (row, error) {
	r := row{name: name, rawName: "space create, cold (no pool)", raw: cold}
	data := filepath.Join(b.tmp, "qemu-pool-data")
	s, stop, err := b.serve(server.Config{DataDir: data, AgentPath: agent, Drivers: "gvisor,qemu", PoolSize: -1,
		PoolDrivers: fmt.Sprintf("qemu=1:%d", qemuMemoryMB)})
	if err != nil {
		return r, err
	}
	defer stop()
	metric := func(sample string) float64 {
		resp, err := http.Get(s.url + "/metrics")
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
		return 0
	}
	const (
		restores = `space_pool_refills_total{driver="qemu",method="restore"}`
		pooled   = `space_sandboxes{state="pooled"}`
	)
	// ready waits for the n-th restore to be in the pool.
	ready := func(n float64) error {
		deadline := time.Now().Add(5 * time.Minute)
		for metric(restores) < n || metric(pooled) < 1 {
			if time.Now().After(deadline) {
				return fmt.Errorf("the qemu pool did not refill by restore (restores %v, pooled %v)", metric(restores), metric(pooled))
			}
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	}
	if err := ready(1); err != nil {
		return r, err
	}
	for i := 0; i < *qemuSamples; i++ {
		time.Sleep(time.Second) // let the refill's QEMU settle
		var sb struct{ ID string }
		t0 := time.Now()
		code := s.do("POST", "/v1/sandboxes", map[string]any{"driver": "qemu", "memory_mb": qemuMemoryMB}, &sb)
		d := time.Since(t0)
		if code != 201 {
			return r, fmt.Errorf("warm create: HTTP %d", code)
		}
		r.space = append(r.space, d)
		err := ready(float64(i + 2))
		s.do("DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
		if err != nil {
			return r, err
		}
	}
	return r, nil
}
