import json,re,statistics as st,sys
def fb(f):
    T=json.load(open(f)); ev=T['traceEvents'] if isinstance(T,dict) else T
    out={}
    for e in ev:
        if e.get('ph')=='X' and e.get('cat')=='compute':
            m=re.match(r'([FB])(\d+)(?:\.(\d+))?',e['name'])
            if not m: continue
            out.setdefault((e['pid'],m.group(1)),[]).append(e['dur'])
    return out
for n in sys.argv[1:]:
    M=fb(f'trace-{n}-measured.json'); S=fb(f'trace-{n}-simulated.json')
    for k in sorted(M):
        m=M[k]; s=S.get(k,[0])
        print(n,k,len(m),f"meas sum {sum(m)/1000:.2f} med {st.median(m):.0f} | sim sum {sum(s)/1000:.2f} med {st.median(s):.0f} | ratio {sum(m)/max(1,sum(s)):.3f}")
        if n=='2' and k[1]=='B': print('   ', ' '.join(f'{x:.0f}' for x in m))
        if n=='2' and k[1]=='F': print('   ', ' '.join(f'{x:.0f}' for x in m))
