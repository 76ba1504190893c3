#!/usr/bin/env bash
# Build the pinned control-plane binaries from the Go module proxy, once, into
#   ${EVOKUBE_CACHE:-~/.cache/evokube}/bin/<component>-<version>/
# A component whose folder already holds its binaries (and a .complete stamp)
# is skipped, so a warm run costs nothing. Prints the folders it built or found.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${EVOKUBE_CACHE:-$HOME/.cache/evokube}
export GOFLAGS="${GOFLAGS:-} -buildvcs=false -trimpath"
export CGO_ENABLED=0
# Two cores: let go use both for compiling but keep the linker count small.
export GOMAXPROCS=${GOMAXPROCS:-2}

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

done_in() { [[ -f "$1/.complete" ]]; }

# build_wrapper DIR MODULE VERSION LDFLAGS PKG... : build packages of a module
# that cannot be `go install`ed (it has replace directives) from a throwaway
# wrapper module that requires it.
build_wrapper() {
  local out=$1 module=$2 version=$3 ldflags=$4; shift 4
  local work; work=$(mktemp -d)
  (
    cd "$work"
    go mod init evokube.local/wrapper >/dev/null 2>&1
    go mod edit -require="$module@$version"
    if [[ $module == k8s.io/kubernetes ]]; then
      # Replace every staging module that the release's go.mod points at
      # ./staging/src/... with its published v0.X.Y.
      local gomod staging
      gomod=$(go mod download -json "$module@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
      staging="v0.${version#v1.}"
      grep -oE '^\s*k8s\.io/[a-z0-9./-]+ => \./staging' "$gomod" | awk '{print $1}' | while read -r m; do
        go mod edit -replace="$m=$m@$staging"
      done
    fi
    # Import the mains so `go mod tidy` keeps their dependencies.
    { echo "//go:build tools"; echo "package tools"; echo "import ("
      for p in "$@"; do echo "  _ \"$p\""; done; echo ")"; } > tools.go
    go mod tidy >/dev/null 2>"$work/tidy.log" || { cat "$work/tidy.log" >&2; exit 1; }
    mkdir -p "$out"
    for p in "$@"; do
      log "go build $p"
      go build -ldflags "$ldflags" -o "$out/" "$p"
    done
  )
  rm -rf "$work"
}

k8s_ldflags() {
  local v=$1 minor major; major=${v#v}; major=${major%%.*}
  minor=${v#v*.}; minor=${minor%%.*}
  local flags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

# The Kubernetes release of minor $EVOKUBE_KUBE_MINOR (1.35, say): one of the
# pinned ones; unset, the newest.
kubernetes_version() {
  local minor=${EVOKUBE_KUBE_MINOR:-} v
  [[ -z $minor ]] && { echo "$KUBERNETES_VERSION"; return; }
  for v in "$KUBERNETES_VERSION" "$KUBERNETES_OLDEST_VERSION"; do
    [[ $v == "v$minor."* ]] && { echo "$v"; return; }
  done
  log "EVOKUBE_KUBE_MINOR=$minor is not pinned: $KUBERNETES_VERSION or $KUBERNETES_OLDEST_VERSION"
  return 1
}

build_kubernetes() {
  local version; version=$(kubernetes_version)
  local out="$cache/bin/kubernetes-$version"
  done_in "$out" && { echo "$out"; return; }
  log "building Kubernetes $version into $out (cold: tens of minutes on 2 cores)"
  build_wrapper "$out" k8s.io/kubernetes "$version" "$(k8s_ldflags "$version")" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  touch "$out/.complete"; echo "$out"
}

build_etcd() {
  local out="$cache/bin/etcd-$ETCD_VERSION"
  done_in "$out" && { echo "$out"; return; }
  log "building etcd $ETCD_VERSION into $out"
  build_wrapper "$out" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" \
    "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" go.etcd.io/etcd/server/v3
  mv "$out/server" "$out/etcd"
  touch "$out/.complete"; echo "$out"
}

# go_install NAME VERSION PACKAGE@VERSION LDFLAGS: a module without replaces.
go_install() {
  local name=$1 version=$2 pkg=$3 ldflags=$4
  local out="$cache/bin/$name-$version"
  done_in "$out" && { echo "$out"; return; }
  log "building $name $version into $out"
  mkdir -p "$out"
  GOBIN="$out" go install -ldflags "-s -w $ldflags" "$pkg"
  touch "$out/.complete"; echo "$out"
}

build_kwok() {
  go_install kwok "$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" \
    "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
}

build_helm() {
  local major=${HELM_VERSION%%.*}
  go_install helm "$HELM_VERSION" "helm.sh/helm/$major/cmd/helm@$HELM_VERSION" \
    "-X helm.sh/helm/$major/internal/version.version=$HELM_VERSION"
}

build_fake_gcs_server() {
  go_install fake-gcs-server "$FAKE_GCS_SERVER_VERSION" \
    "github.com/fsouza/fake-gcs-server@$FAKE_GCS_SERVER_VERSION" ""
}

# Kueue's manager has no replace directives, so it installs like kwok. Its CRDs and
# webhook manifests ship in the module zip; keep copies beside the binary so the
# tests (tests/cluster/kueue.py) need nothing but this folder.
build_kueue() {
  local out="$cache/bin/kueue-$KUEUE_VERSION"
  done_in "$out" && { echo "$out"; return; }
  local dir
  dir=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [[ -d $dir/config/components/crd/bases ]] || { log "no CRDs in $dir"; return 1; }
  log "building kueue $KUEUE_VERSION into $out (cold: several minutes on 2 cores)"
  mkdir -p "$out"
  GOBIN="$out" go install -ldflags "-s -w \
    -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION \
    -X sigs.k8s.io/kueue/pkg/version.BuildDate=1970-01-01T00:00:00Z" \
    "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  # The CRDs (bases/ and the conversion-webhook patches) and the webhook manifests
  # with their kustomization, as the module lays them out. Module files are
  # read-only; make the copies ours so that a rebuild can replace them.
  rm -rf "$out/config"; mkdir "$out/config"
  cp -R "$dir/config/components/crd" "$dir/config/components/webhook" "$out/config/"
  chmod -R u+w "$out/config"
  touch "$out/.complete"; echo "$out"
}

# JobSet's manager is main.go at its module root; the folder keeps its CRD and webhook manifests beside it as Kueue does
# (tests/cluster/jobset.py).
build_jobset() {
  local out="$cache/bin/jobset-$JOBSET_VERSION"
  done_in "$out" && { echo "$out"; return; }
  local dir
  dir=$(go mod download -json "sigs.k8s.io/jobset@$JOBSET_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [[ -d $dir/config/components/crd/bases ]] || { log "no CRDs in $dir"; return 1; }
  log "building jobset $JOBSET_VERSION into $out (cold: several minutes on 2 cores)"
  # Built from a wrapper: `go install pkg@version` asks the proxy for the module's
  # version list (for deprecations), which the proxy refuses for this module.
  build_wrapper "$out" sigs.k8s.io/jobset "$JOBSET_VERSION" \
    "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$JOBSET_VERSION" sigs.k8s.io/jobset
  rm -rf "$out/config"; mkdir "$out/config"
  cp -R "$dir/config/components/crd" "$dir/config/components/webhook" "$out/config/"
  chmod -R u+w "$out/config"
  touch "$out/.complete"; echo "$out"
}

components=("$@")
[[ ${#components[@]} -gt 0 ]] || components=(etcd kwok helm kubernetes fake_gcs_server kueue jobset)
for c in "${components[@]}"; do
  started=$SECONDS
  "build_$c"
  log "$c: $((SECONDS - started)) s"
done
