package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestKernelInitLine runs each kernel driver on the host (python3 and
// node, as in the templates) with an identity line between two
// executions, as the agent writes it to a kernel's copy in a fork's child:
// the line is no execution (the counts go 1, 2 and no message answers
// it), and its env is the kernel's from then on. A kernel that took it
// for a cell answered with an execution of its own, which the facade read
// as the next cell's (TestE2BAcrossRestart's fork saw no result).
func TestKernelInitLine(t *testing.T) {
	for _, tc := range []struct {
		language      string
		first, second string
		want          string // in the second execution's messages
	}{
		{"python", "x = 1", "import os\nf\"{x} {os.environ['SPACE_T']}\"", `"text": "1 child"`},
		{"javascript", "globalThis.x = 1", "`${x} ${process.env.SPACE_T}`", `"text":"1 child"`},
		{"bash", "X=1", `echo "$X $SPACE_T"`, `"text": "1 child\n"`},
	} {
		t.Run(tc.language, func(t *testing.T) {
			dir, argv := kernelFiles(t, tc.language)
			var in bytes.Buffer
			for _, l := range []any{
				map[string]any{"code": tc.first},
				map[string]any{"init": map[string]any{"env": map[string]string{"SPACE_T": "child", "bad name": "x"}}},
				map[string]any{"code": tc.second},
			} {
				b, _ := json.Marshal(l)
				in.Write(append(b, '\n'))
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "SPACE_T=pool")
			cmd.Stdin = &in
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%v: %v\nstderr: %s", argv, err, stderr.Bytes())
			}
			var execs [][]string // each execution's messages
			for _, l := range strings.Split(string(out), "\n") {
				_, msg, ok := strings.Cut(l, string(rune(msgMark)))
				if !ok {
					continue
				}
				var head struct {
					Type  string `json:"type"`
					Count int    `json:"execution_count"`
				}
				if err := json.Unmarshal([]byte(msg), &head); err != nil {
					t.Fatalf("message %q: %v", msg, err)
				}
				if head.Type == "number_of_executions" {
					if head.Count != len(execs)+1 {
						t.Errorf("execution_count %d, want %d", head.Count, len(execs)+1)
					}
					execs = append(execs, nil)
					continue
				}
				if len(execs) == 0 {
					t.Fatalf("message %q before any execution", msg)
				}
				execs[len(execs)-1] = append(execs[len(execs)-1], msg)
			}
			if len(execs) != 2 {
				t.Fatalf("%d executions, want 2 (the identity line is none): %q", len(execs), out)
			}
			second := strings.Join(execs[1], "\n")
			if !strings.Contains(second, tc.want) || strings.Contains(second, `"error"`) {
				t.Errorf("second execution: %s\nwant %s in it and no error (stderr: %s)", second, tc.want, stderr.Bytes())
			}
		})
	}
}

// TestKernelIPython runs the Python kernel on the host (python3 with
// IPython, as in python-data): cells go through IPython's input
// transformation as in E2B's Jupyter kernel. Indented code (a JS template
// literal's) is dedented, `!cmd` runs a shell, `%cd` is a magic, and a
// str result's text has no quotes. Before, the kernel compiled cells
// itself: IndentationError, SyntaxError, and 'bar' for bar.
func TestKernelIPython(t *testing.T) {
	if exec.Command("python3", "-c", "import IPython").Run() != nil {
		t.Skip("python3 without IPython (python-data has python3-ipython)")
	}
	k := startHostKernel(t, "python")
	for _, tc := range []struct {
		code, want string
	}{
		{"\n    x = 'bar'\n    x\n", "bar"},
		{"!echo from-shell", "from-shell"},
		{"%cd /tmp\nimport os\nos.getcwd()", "/tmp"},
		{"x + \"'s\"", `"bar's"`},
		{"y = 2\ny * 21", "42"},
		{"y;", ""},
	} {
		text, errName := outcome(k.exec(map[string]any{"code": tc.code}))
		if strings.TrimSpace(text) != tc.want || errName != "" {
			t.Errorf("%q: text %q, error %q; want %q", tc.code, text, errName, tc.want)
		}
	}
	msgs := k.exec(map[string]any{"code": "def f():\n    return nope\nf()"})
	if _, errName := outcome(msgs); errName != "NameError" {
		t.Errorf("a failing cell: %v, want a NameError", msgs)
	}
	msgs = k.exec(map[string]any{"code": "display('shown')\n'main'"})
	if len(msgs) != 2 || msgs[0]["text"] != "shown" || msgs[0]["is_main_result"] != false || msgs[1]["text"] != "main" || msgs[1]["is_main_result"] != true {
		t.Errorf("display and a main result: %v", msgs)
	}
}
