package e2b

import "encoding/json"

// Kernel is the code interpreter's kernel for language ("python",
// "javascript" or "bash"; "" is python) as other front ends (the MCP
// server's code_run) run it: the file to write in the sandbox, its source,
// and the argv that runs it. The kernel reads one request per line on
// stdin (KernelRequest) and writes its messages as lines starting with
// KernelMessageMark.
func Kernel(language string) (file string, src []byte, argv []string, err error) {
	lang, err := normLanguage(language)
	if err != nil {
		return "", nil, nil, err
	}
	file, src, argv = kernelOf(lang)
	return file, src, argv, nil
}

// KernelRequest is the stdin line that runs code in a kernel.
func KernelRequest(code string, env map[string]string) []byte {
	line, _ := json.Marshal(map[string]any{"id": newExecID(), "code": code, "env": env})
	return append(line, '\n')
}

// KernelMessageMark starts every kernel message line (JSON after it).
const KernelMessageMark = msgMark
