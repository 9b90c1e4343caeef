package e2b

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/e2b/gen/process"
	"github.com/spacesandbox/space/internal/e2b/gen/process/processconnect"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// keepaliveEvery is how often an idle stream gets a keepalive message, so
// idle proxies keep the connection (the SDK ignores them).
const keepaliveEvery = 30 * time.Second

// processServer is envd's process.Process over the sandbox service.
// Process tags are kept by the agent with the process (ExecRequest.Tag),
// so they are found after a server restart and in a fork's children.
type processServer struct {
	h *Handler
}

// reservedTagPrefix starts the tags the facade gives its own processes
// (code-interpreter kernels); a caller cannot choose one.
const reservedTagPrefix = "space."

var _ processconnect.ProcessHandler = (*processServer)(nil)

// userOf is the user a request runs as: the Basic-auth user name the SDK
// sends when a user is given ("" = the sandbox's default user).
func userOf(header http.Header) string {
	a, ok := strings.CutPrefix(header.Get("Authorization"), "Basic ")
	if !ok {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(a))
	if err != nil {
		return ""
	}
	u, _, _ := strings.Cut(string(b), ":")
	return u
}

func (p *processServer) pid(ctx context.Context, sel *process.ProcessSelector) (int, error) {
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		return int(s.Pid), nil
	case *process.ProcessSelector_Tag:
		t := targetOf(ctx)
		procs, err := p.h.svc.Processes(ctx, t.caller, t.id)
		if err != nil {
			return 0, err
		}
		if pr, ok := runningTagged(procs, s.Tag); ok {
			return pr.PID, nil
		}
		return 0, errdefs.NotFound("process with tag %q not found", s.Tag)
	}
	return 0, errdefs.InvalidArgument("process: give a pid or a tag")
}

func (p *processServer) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	t := targetOf(ctx)
	m := req.Msg
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return connectError(errdefs.InvalidArgument("process.cmd: required"))
	}
	if strings.HasPrefix(m.GetTag(), reservedTagPrefix) {
		return connectError(errdefs.InvalidArgument("tag: the prefix %q is reserved", reservedTagPrefix))
	}
	er := sandbox.ExecRequest{
		Cmd: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Env: cfg.GetEnvs(), Cwd: cfg.GetCwd(),
		User: userOf(req.Header()), OpenStdin: m.Stdin == nil || m.GetStdin(), Background: true,
		Tag: m.GetTag(),
	}
	isPTY := m.Pty != nil
	if isPTY {
		size := m.GetPty().GetSize()
		er.PTY = &agentproto.PTYSize{Cols: uint16(max(size.GetCols(), 1)), Rows: uint16(max(size.GetRows(), 1))}
	}
	// Start and follow in one round trip to the agent.
	pid, evs, err := p.h.svc.Run(ctx, t.caller, t.id, er)
	if err != nil {
		return connectError(err)
	}
	return p.stream(ctx, t, pid, isPTY, evs, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	})
}

func (p *processServer) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	t := targetOf(ctx)
	pid, err := p.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return connectError(err)
	}
	isPTY := false
	procs, err := p.h.svc.Processes(ctx, t.caller, t.id)
	if err != nil {
		return connectError(err)
	}
	found := false
	for _, pr := range procs {
		if pr.PID == pid {
			found, isPTY = true, pr.PTY
		}
	}
	if !found {
		return connectError(errdefs.NotFound("process %d not found", pid))
	}
	return p.stream(ctx, t, pid, isPTY, nil, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: ev})
	})
}

// stream sends start, then the process's output from the beginning of its
// buffered log (so a reconnect sees everything the agent still holds),
// keepalives while idle, and the end event. evs, when not nil, is the
// stream Run opened; otherwise the stream is opened here.
func (p *processServer) stream(ctx context.Context, t envdTarget, pid int, isPTY bool, evs sandbox.EventStream, send func(*process.ProcessEvent) error) error {
	if evs == nil {
		var err error
		if evs, err = p.h.svc.Events(ctx, t.caller, t.id, pid, 1, true); err != nil {
			return connectError(err)
		}
	}
	defer evs.Close()
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(pid)}}}); err != nil {
		return err
	}
	ch := pump(ctx, evs.Next, 16)
	tick := time.NewTicker(keepaliveEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return connectError(ctx.Err())
		case <-tick.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case it, ok := <-ch:
			if !ok {
				return nil
			}
			if it.err != nil && p.h.sandboxEnded(t.id) {
				dropConnection() // killed while the client waited: as E2B
			}
			if it.err == io.EOF {
				return connect.NewError(connect.CodeUnavailable, fmt.Errorf("process %d: stream ended without an exit", pid))
			}
			if it.err != nil {
				return connectError(it.err)
			}
			ev := toProcessEvent(it.v, isPTY)
			if ev == nil {
				continue
			}
			if err := send(ev); err != nil {
				return err
			}
			evs.Recycle(it.v.Data) // Send marshaled it: the stream may reuse it
			if it.v.Type == agentproto.EventExit {
				return nil
			}
		}
	}
}

// toProcessEvent maps an agent event; nil for those envd has no word for.
func toProcessEvent(e agentproto.Event, isPTY bool) *process.ProcessEvent {
	switch e.Type {
	case agentproto.EventStdout:
		d := &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: e.Data}}
		if isPTY {
			d.Output = &process.ProcessEvent_DataEvent_Pty{Pty: e.Data}
		}
		return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}
	case agentproto.EventStderr:
		return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: e.Data}}}}
	case agentproto.EventExit:
		return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: endEvent(e)}}
	}
	return nil
}

// endEvent fills status and error the way envd does (Go's
// ProcessState.String: "exit status 1", "signal: killed").
func endEvent(e agentproto.Event) *process.ProcessEvent_EndEvent {
	end := &process.ProcessEvent_EndEvent{Exited: true}
	switch {
	case e.ExitCode != nil && e.Signal == "":
		end.ExitCode = int32(*e.ExitCode)
		end.Status = fmt.Sprintf("exit status %d", *e.ExitCode)
	case e.Signal != "":
		end.ExitCode = -1
		end.Exited = false
		end.Status = "signal: " + signalText(e.Signal)
	default:
		end.ExitCode = -1
		end.Status = "exit status -1"
	}
	if end.ExitCode != 0 {
		msg := end.Status
		if e.Error != "" {
			msg = e.Error
		}
		end.Error = &msg
	}
	return end
}

func signalText(sig string) string {
	switch strings.TrimPrefix(sig, "SIG") {
	case "KILL":
		return "killed"
	case "TERM":
		return "terminated"
	case "INT":
		return "interrupt"
	case "HUP":
		return "hangup"
	}
	return sig
}

func (p *processServer) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	t := targetOf(ctx)
	procs, err := p.h.svc.Processes(ctx, t.caller, t.id)
	if err != nil {
		return nil, connectError(err)
	}
	out := &process.ListResponse{}
	for _, pr := range procs {
		if !pr.Running || len(pr.Cmd) == 0 {
			continue
		}
		info := &process.ProcessInfo{Pid: uint32(pr.PID), Config: &process.ProcessConfig{Cmd: pr.Cmd[0], Args: pr.Cmd[1:], Envs: map[string]string{}}}
		if pr.Cwd != "" {
			cwd := pr.Cwd
			info.Config.Cwd = &cwd
		}
		if pr.Tag != "" {
			tag := pr.Tag
			info.Tag = &tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

func (p *processServer) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	t := targetOf(ctx)
	pid, err := p.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	if req.Msg.Pty != nil {
		size := req.Msg.GetPty().GetSize()
		if err := p.h.svc.Resize(ctx, t.caller, t.id, pid, agentproto.PTYSize{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())}); err != nil {
			return nil, connectError(err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

func inputBytes(in *process.ProcessInput) []byte {
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		return v.Stdin
	case *process.ProcessInput_Pty:
		return v.Pty
	}
	return nil
}

func (p *processServer) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	t := targetOf(ctx)
	pid, err := p.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	if err := p.h.svc.Stdin(ctx, t.caller, t.id, pid, bytes.NewReader(inputBytes(req.Msg.GetInput())), false); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// StreamInput takes a start (the process), then data messages, in order.
func (p *processServer) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	t := targetOf(ctx)
	pid := 0
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			n, err := p.pid(ctx, ev.Start.GetProcess())
			if err != nil {
				return nil, connectError(err)
			}
			pid = n
		case *process.StreamInputRequest_Data:
			if pid == 0 {
				return nil, connectError(errdefs.InvalidArgument("data before start"))
			}
			if err := p.h.svc.Stdin(ctx, t.caller, t.id, pid, bytes.NewReader(inputBytes(ev.Data.GetInput())), false); err != nil {
				return nil, connectError(err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (p *processServer) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	t := targetOf(ctx)
	pid, err := p.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	sig := "SIGKILL"
	if req.Msg.GetSignal() == process.Signal_SIGNAL_SIGTERM {
		sig = "SIGTERM"
	}
	if err := p.h.svc.Signal(ctx, t.caller, t.id, pid, sig); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (p *processServer) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	t := targetOf(ctx)
	pid, err := p.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	if err := p.h.svc.Stdin(ctx, t.caller, t.id, pid, bytes.NewReader(nil), true); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// runningTagged returns the running process with tag, the latest started
// when several have it.
func runningTagged(procs []agentproto.Process, tag string) (agentproto.Process, bool) {
	var found agentproto.Process
	ok := false
	for _, pr := range procs {
		if pr.Running && pr.Tag == tag && (!ok || pr.StartedAt.After(found.StartedAt)) {
			found, ok = pr, true
		}
	}
	return found, ok
}
