# Shared by capture-extra.sh and capture-agent.sh (sourced; needs B and OUT set).
# post NAME PATH BODY [extra curl args]: writes OUT/NAME (`### ` lines, the response head, a
# blank line, the raw body), byte for byte.
post() {
  local name="$1" path="$2" body="$3"
  shift 3
  {
    echo "### POST ${path}"
    echo "### request body: ${body}"
    echo "### ---- raw response (headers then body, unmodified) ----"
    curl -sS -N -D - -H 'Content-Type: application/json' --data-binary "$body" "$@" "${B}${path}"
  } > "${OUT}/${name}"
  echo "wrote ${OUT}/${name} ($(wc -c < "${OUT}/${name}") bytes)"
}
